"""bench kernels: both contenders timed at each row count, after a short or a long context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench.kernel_steps import CONTENDERS, context_cache, run
from tests.support.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("bench-kernels") / "model", "llama", hidden_size=64)


@pytest.mark.parametrize("context", [32, 100])
def test_every_contender_is_timed_at_every_row_count(tiny: Path, tmp_path: Path, context: int) -> None:
    folder = run(str(tiny), [1, 3], threads=1, out_dir=tmp_path, repeats=2, context=context)
    report = json.loads((folder / "kernels.json").read_text())
    assert report["context"] == context
    assert set(report["costs_ms"]) == set(CONTENDERS)
    for costs in report["costs_ms"].values():
        assert set(costs) == {"1", "3"} and all(ms > 0 for ms in costs.values())


def test_a_long_context_is_committed_random_keys(tiny: Path) -> None:
    from ops.bench.formats import load_format

    decoder = load_format(str(tiny), "auto-native").loaded.decoder
    cache = context_cache(decoder, 4, 300)
    assert cache.length == 300
    assert cache.keys[:, :, :300].abs().sum() > 0 and cache.values[:, :, :300].abs().sum() > 0
