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
    assert "| 700 |" in (out / "context.md").read_text()
