"""A random hybrid's forward in each weight format: dense against int8 and int4 on the kernels.

    python -m ops.bench.hybrid_formats [--family qwen3_5 qwen3_next] [--formats none int8 int4]
        [--rows 1 4] [--repeats 5] [--threads 1]

In process, on the hybrid that ops/bench/random_hybrid.py writes (8 layers, hidden 512, the
default model's vocabulary; Qwen3-Next's with 8 experts): per format, the bytes the decoder holds
and the best time of one forward of n rows with logits after a 32-token context (row_timing.py:
a decode step at 1 row, a verification at more), the formats timed in turn. `none` is the exact
path in float32; int8 and int4 follow weight_formats.py's rule (`--kernels auto`: native where
this CPU has a path).
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from ops.bench.random_hybrid import FAMILIES, hybrid_shape_summary, write_random_hybrid
from worker.models.held_bytes import held_tensor_bytes
from worker.models.loader import load_model
from worker.models.row_timing import forward_cost, new_timing_cache

FORMATS = ("none", "int8", "int4")


@dataclass(slots=True)
class FormatTiming:
    format: str  # LinearFormats.describe(): "int4 (native avx512_vnni)"
    held_bytes: int
    ms: dict[int, float]  # rows -> best milliseconds of one forward


def measure(folder: Path, formats: list[str], rows: list[int], repeats: int) -> list[FormatTiming]:
    """Every format loaded at once, then timed in turn, format after format for each repeat: a
    shared machine's load moves them together, so their ratios hold."""
    decoders = []
    results: list[FormatTiming] = []
    for weight_format in formats:
        model = load_model(folder, dtype="float32" if weight_format == "none" else "auto", quantize=weight_format)
        assert model.formats is not None
        decoders.append((model.decoder, new_timing_cache(model.decoder, max(rows))))
        held = held_tensor_bytes(model.decoder)
        results.append(FormatTiming(model.formats.describe(), held, dict.fromkeys(rows, float("inf"))))
    for _ in range(repeats):
        for (decoder, cache), result in zip(decoders, results, strict=True):
            for n in rows:
                result.ms[n] = min(result.ms[n], 1000 * forward_cost(decoder, cache, n, repeats=1))
    return results


def table(results: dict[str, list[FormatTiming]], rows: list[int]) -> str:
    header = "| family | format | held MB | " + " | ".join(f"{n}-row forward, ms" for n in rows) + " | 1 row vs dense |"
    lines = [header, "|" + "---|" * (4 + len(rows))]
    for family, measured in results.items():
        dense = measured[0].ms[rows[0]]
        for result in measured:
            times = " | ".join(f"{result.ms[n]:.2f}" for n in rows)
            speedup = dense / result.ms[rows[0]]
            lines.append(f"| {family} | {result.format} | {result.held_bytes / 1e6:.1f} | {times} | {speedup:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.hybrid_formats", description=__doc__.splitlines()[0])
    parser.add_argument("--family", nargs="+", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    parser.add_argument(
        "--formats", nargs="+", choices=FORMATS, default=list(FORMATS), help="the first is the baseline"
    )
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per row count (best kept)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    results: dict[str, list[FormatTiming]] = {}
    for family in args.family:
        with tempfile.TemporaryDirectory(prefix="arbor-random-hybrid-") as folder:
            checkpoint = write_random_hybrid(Path(folder), family)
            results[family] = measure(checkpoint, args.formats, args.rows, args.repeats)
    print(f"random hybrids ({hybrid_shape_summary()}), {args.threads} thread(s)")
    print(table(results, args.rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
