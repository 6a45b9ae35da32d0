"""`arbor capacity` prints the table a user reads before deploying (figures: tests/worker/models/test_capacity.py)."""

from __future__ import annotations

import json

from ops.cli import main
from tests.worker.models.real_size_configs import QWEN3_NEXT_80B_A3B


def test_capacity_prints_the_table_for_a_config(tmp_path, capsys):
    folder = tmp_path / "Qwen3-Next-80B-A3B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_NEXT_80B_A3B))

    status = main(["capacity", "--model", str(folder), "--context", "262144", "--device-memory", "80GB,141GB",
                   "--format", "int4"])  # fmt: skip

    out = capsys.readouterr().out
    assert status == 0
    assert "79,674,391,296 parameters" in out and "60.2 GB" in out
    assert "24,576 B" in out and "77,266,944 B" in out
    # device, cache, K/V tokens, state lanes, contexts: "80.0 GB  11.8 GB  479,755  152  1"
    table = {row[0]: row[4:] for row in map(str.split, out.splitlines()) if len(row) == 7 and row[1] == "GB"}
    assert table == {"80.0": ["479,755", "152", "1"], "141.0": ["2,713,642", "863", "10"]}


def test_capacity_names_a_bad_size(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_NEXT_80B_A3B))
    assert main(["capacity", "--model", str(tmp_path / "config.json"), "--device-memory", "lots"]) == 2
    assert "memory size 'lots'" in capsys.readouterr().err


def test_capacity_without_a_config_says_so(tmp_path, capsys):
    assert main(["capacity", "--model", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
