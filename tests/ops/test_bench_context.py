"""`arbor bench context` on a tiny hybrid: a row per length, prefill and decode measured."""

from __future__ import annotations

import json

from ops.cli import main
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model


def test_bench_context_measures_each_length(tmp_path):
    model = make_tiny_hybrid_model(tmp_path / "tiny", "qwen3_5_text", max_position_embeddings=4096)
    out = tmp_path / "results"

    status = main(["bench", "context", "--model", str(model), "--lengths", "40,700", "--decode-tokens", "3",
                   "--threads", "1", "--out", str(out)])  # fmt: skip

    assert status == 0
    rows = json.loads((out / "context.json").read_text())["rows"]
    assert [row["context"] for row in rows] == [40, 700]  # 700: past one 512-row prefill chunk
    assert all(row["prefill_tok_s"] > 0 and row["decode_tok_s"] > 0 and row["peak_rss_mb"] > 0 for row in rows)
    caption, _, table = (out / "context.md").read_text().partition("\n\n")
    assert "| 700 |" in table
    assert "float32, 1 torch thread(s)" in caption and "3 greedy tokens" in caption  # the table says what it ran


def test_bench_context_refuses_a_length_past_the_models_maximum(tmp_path, capsys):
    model = make_tiny_hybrid_model(tmp_path / "tiny", "qwen3_5_text", max_position_embeddings=4096)

    status = main(["bench", "context", "--model", str(model), "--lengths", "40,4090", "--decode-tokens", "8",
                   "--out", str(tmp_path / "results")])  # fmt: skip

    assert status == 2
    assert "--lengths: 4090 + --decode-tokens 8 pass the model's 4096 tokens" in capsys.readouterr().err
    assert not (tmp_path / "results" / "context.json").exists()
