"""`arbor bench kernels`: one decode forward's cost at 1..32 rows, native kernels against torch's, in one run.

Both models load the same file in the default format; the forwards compute logits for every row (the
decode format), after a 32-token context, or after `--context` tokens of random K/V (what a step
costs does not depend on the values: at thousands of keys attention is much of it). The contenders
take turns row count by row count, each point the median of `repeats` forwards, so a neighbour's
load falls on both alike. The physical floor is the weights' bytes over the memory bandwidth one
core reads at (`floor_ms`, measured here by summing a 256 MB float32 tensor).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ops.bench.formats import load_format
from ops.bench.results import machine_info, results_dir, write_json
from worker.models.row_timing import CONTEXT_TOKENS, new_timing_cache

CONTENDERS = ("auto-torch", "auto-native")


@torch.inference_mode()
def forward_ms(decoder, cache, rows: int, repeats: int) -> float:
    start = cache.length
    token_ids = torch.arange(rows) % decoder.config.vocab_size
    positions = torch.arange(start, start + rows)
    decoder(token_ids, positions, cache)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        decoder(token_ids, positions, cache)
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e3


def read_bandwidth_gb_s() -> float:
    values = torch.ones(64 * 1024 * 1024)  # 256 MB, past any cache
    best = 0.0
    for _ in range(3):
        began = time.perf_counter()
        values.sum()
        best = max(best, values.numel() * 4 / (time.perf_counter() - began) / 1e9)
    return best


def weight_bytes(decoder) -> int:
    from worker.kernels.native_linear import NativeQuantizedLinear

    return sum(m.num_bytes for m in decoder.modules() if isinstance(m, NativeQuantizedLinear))


def context_cache(decoder, max_rows: int, context: int):
    """A cache of `context` committed tokens: a real prefill up to CONTEXT_TOKENS, random K/V past it."""
    if context <= CONTEXT_TOKENS:
        return new_timing_cache(decoder, max_rows)
    cache = decoder.new_cache(context + max_rows)
    cache.reserve(context + max_rows)
    generator = torch.Generator().manual_seed(0)
    for tensor in (cache.keys, cache.values):
        tensor.copy_(torch.randn(tensor.shape, generator=generator).to(tensor.dtype))
    cache.commit(context)
    return cache


def run(
    model: str | None,
    row_counts: list[int],
    threads: int,
    out_dir: Path | None,
    repeats: int = 15,
    context: int = CONTEXT_TOKENS,
) -> Path:
    torch.set_num_threads(threads)
    loaded = {name: load_format(model, name).loaded.decoder for name in CONTENDERS}
    caches = {name: context_cache(decoder, max(row_counts), context) for name, decoder in loaded.items()}
    costs: dict[str, dict[int, float]] = {name: {} for name in CONTENDERS}
    for turn, rows in enumerate(row_counts):
        order = CONTENDERS if turn % 2 == 0 else CONTENDERS[::-1]
        for name in order:
            costs[name][rows] = round(forward_ms(loaded[name], caches[name], rows, repeats), 3)
    bandwidth = read_bandwidth_gb_s()
    native_bytes = weight_bytes(loaded["auto-native"])
    report = {
        "machine": machine_info(),
        "threads": threads,
        "context": context,
        "costs_ms": costs,
        "native_weight_mb": round(native_bytes / 1e6, 1),
        "read_bandwidth_gb_s": round(bandwidth, 2),
        "floor_ms": round(native_bytes / bandwidth / 1e6, 2),
    }
    folder = results_dir(out_dir)
    write_json(folder / "kernels.json", report)
    print(kernels_markdown(report))
    return folder


def kernels_markdown(report: dict) -> str:
    costs = report["costs_ms"]
    rows = sorted(costs["auto-torch"])
    lines = [
        f"{report['machine']['cpu']}, {report['threads']} thread(s); ms per forward with logits for every row, "
        f"after {report.get('context', CONTEXT_TOKENS)} tokens of context",
        "",
        "| rows | " + " | ".join(str(r) for r in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    for name in CONTENDERS:
        lines.append(f"| {name} | " + " | ".join(f"{costs[name][r]:.2f}" for r in rows) + " |")
    lines.append(
        "| torch / native | "
        + " | ".join(f"{costs['auto-torch'][r] / costs['auto-native'][r]:.2f}x" for r in rows)
        + " |"
    )
    lines.append("")
    lines.append(
        f"Native weights {report['native_weight_mb']} MB at {report['read_bandwidth_gb_s']} GB/s read: "
        f"floor {report['floor_ms']} ms a forward."
    )
    return "\n".join(lines)
