"""The ceiling benchmark runs end to end on a tiny model and its oracle runs reproduce plain decoding."""

from __future__ import annotations

from ops.bench.ceiling import ORACLES, VERIFY_SIZES, main
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints


def test_bench_ceiling_prints_both_tables_with_exact_oracle_runs(capsys):
    with one_torch_thread():
        argv = ["--model", str(speculation_checkpoints("qwen3").target), "--max-tokens", "16", "--repeats", "1"]
        assert main(argv) == 0
    out = capsys.readouterr().out
    decode_rows = [
        line
        for line in out.splitlines()
        if line.startswith("| none") or line.startswith("| chain") or line.startswith("| tree")
    ]
    assert len(decode_rows) == 1 + len(ORACLES)
    assert all(row.rstrip().endswith("| yes |") for row in decode_rows), decode_rows
    assert "| chain k=3 | 4.00 |" in out and "| chain k=7 | 8.00 |" in out
    for size in VERIFY_SIZES:
        assert f"\n| {size} | " in out


def test_bench_ceiling_on_a_random_hybrid_adds_the_chunked_form(capsys):
    """The random Qwen3.5-layout hybrid (6 DeltaNet + 2 attention layers) goes through our loader;
    the oracle's chains and trees over its recurrent state reproduce plain decoding."""
    with one_torch_thread():
        assert main(["--random-hybrid", "qwen3_5", "--max-tokens", "8", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("model random qwen3_5 (8 layers: 6 DeltaNet + 2 attention, hidden 512), float32 on cpu")
    decode_rows = [line for line in out.splitlines() if line.startswith(("| none", "| chain", "| tree"))]
    assert len(decode_rows) == 1 + len(ORACLES)
    assert all(row.rstrip().endswith("| yes |") for row in decode_rows), decode_rows
    assert "| chain k=3 | 4.00 |" in out and "| chain k=7 | 8.00 |" in out
    assert "| ms/token | as a prefill chunk, ms | lm_head, ms |" in out
    for size in VERIFY_SIZES:
        assert f"\n| {size} | " in out
