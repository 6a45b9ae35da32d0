"""The hybrid formats benchmark measures each format of a tiny hybrid, and the quantized ones hold fewer bytes."""

from __future__ import annotations

from pathlib import Path

from ops.bench.hybrid_formats import measure, table
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.worker.models.hybrid.test_hybrid_quantized import QUANTIZABLE_SHAPES


def test_each_format_is_measured_in_the_format_it_names(tmp_path: Path) -> None:
    folder = make_tiny_hybrid_model(tmp_path / "next", "qwen3_next", **QUANTIZABLE_SHAPES)
    with one_torch_thread():
        measured = measure(folder, ["none", "int8", "int4"], [1, 3], repeats=1)
    assert [m.format.split()[0] for m in measured] == ["float32", "int8", "int4"]
    held = [m.held_bytes for m in measured]
    assert held[0] > held[1] > held[2]
    assert all(0 < m.ms[1] < float("inf") and 0 < m.ms[3] < float("inf") for m in measured)
    lines = table({"qwen3_next": measured}, [1, 3]).splitlines()
    assert lines[0] == "| family | format | held MB | 1-row forward, ms | 3-row forward, ms | 1 row vs dense |"
    assert len(lines) == 2 + 3 and lines[2].endswith("| 1.00x |")
