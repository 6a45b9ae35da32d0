"""`python -m ops.bench.kernel_paths`: one quantized linear on every native path this CPU runs,
against PyTorch's int4 kernel, at a few row counts, one thread.

Each point is the median of `repeats` calls of what a forward calls (quantize the rows, multiply),
with the weight warm in cache (960 x 576 int4 is ~300 KB): a kernel's compute cost, not the
memory-bound cost of a whole model. The portable path is left out by default (~50x slower).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from worker.kernels.native_lib import NativeKernels, load_kernels
from worker.kernels.packing import as_native_sees, pack_int4, pack_int8
from worker.kernels.quantized_weight import Int4Weight, Int8Weight, quantize_int4, quantize_int8
from worker.models.weight_packing import PackedInt4
from worker.models.weight_packing import pack_int4 as pack_int4_for_aten


def median_us(call: Callable[[], object], repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def native_costs(isa: str, n: int, k: int, row_counts: list[int], repeats: int) -> dict[str, float]:
    kernels = load_kernels(isa)
    dense = torch.randn(n, k, generator=torch.Generator().manual_seed(0))
    int4, int8 = as_native_sees(quantize_int4(dense)), as_native_sees(quantize_int8(dense))
    assert isinstance(int4, Int4Weight) and isinstance(int8, Int8Weight)
    costs = {}
    for bits, packed in ((4, pack_int4(int4)), (8, pack_int8(int8))):
        for rows in row_counts:
            forward = partial(native_forward, kernels, packed, bits, torch.randn(rows, k), n)
            costs[f"q{bits} {rows}"] = median_us(forward, repeats)
    return costs


def native_forward(kernels: NativeKernels, packed: torch.Tensor, bits: int, x: torch.Tensor, n: int) -> torch.Tensor:
    return kernels.matmul(packed, bits, kernels.quantize_rows(x), n)


def aten_costs(n: int, k: int, row_counts: list[int], repeats: int) -> dict[str, float]:
    packed = pack_int4_for_aten(quantize_int4(torch.randn(n, k)), "cpu")
    inputs = {rows: torch.randn(rows, k) for rows in row_counts}  # float32, cast as a forward casts them
    return {f"q4 {rows}": median_us(partial(aten_forward, packed, x), repeats) for rows, x in inputs.items()}


def aten_forward(packed: PackedInt4, x: torch.Tensor) -> torch.Tensor:
    return packed.matmul(x.to(torch.bfloat16))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="960x576", help="out x in (default: SmolLM2-135M's qkv)")
    parser.add_argument("--rows", default="1,4,16")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--portable", action="store_true", help="include the portable C path")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, k = map(int, args.shape.split("x"))
    row_counts = [int(rows) for rows in args.rows.split(",")]
    paths = [isa for isa in load_kernels("portable").runnable_paths() if args.portable or isa != "portable"]
    results = {isa: native_costs(isa, n, k, row_counts, args.repeats) for isa in paths}
    results["aten (bf16)"] = aten_costs(n, k, row_counts, args.repeats)
    columns = [f"q{bits} {rows}" for bits in (4, 8) for rows in row_counts]
    print(f"| path ({n}x{k}, us, 1 thread) | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for name, costs in results.items():
        print(f"| {name} | " + " | ".join(f"{costs[c]:.1f}" if c in costs else "-" for c in columns) + " |")


if __name__ == "__main__":
    main()
