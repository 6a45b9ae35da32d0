"""The native int4/int8 kernels against the float64 product of the same quantized values, on every
path this machine runs; and the invariances the serving path relies on (rows, threads). That every
path computes the portable path's bits: test_kernel_paths.py."""

from __future__ import annotations

import pytest
import torch

from worker.kernels.native_lib import NativeKernels, load_kernels
from worker.kernels.packing import as_native_sees, pack_int4, pack_int8
from worker.kernels.quantized_weight import Int4Weight, Int8Weight, quantize_int4, quantize_int8

SHAPES = [(1, 32), (17, 64), (48, 96), (960, 576), (133, 1536)]  # (out, in): odd tiles, one block, many
ROW_COUNTS = [1, 2, 3, 4, 5, 9, 16, 33, 64]


def paths() -> list[str]:
    return load_kernels("portable").runnable_paths()


@pytest.fixture(params=paths())
def kernels(request: pytest.FixtureRequest) -> NativeKernels:
    return load_kernels(request.param)


def weights(out_features: int, in_features: int, seed: int) -> tuple[Int4Weight, Int8Weight]:
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(out_features, in_features, generator=generator)
    int4, int8 = as_native_sees(quantize_int4(dense)), as_native_sees(quantize_int8(dense))
    assert isinstance(int4, Int4Weight) and isinstance(int8, Int8Weight)
    return int4, int8


@pytest.mark.parametrize("two_term", [True, False])
@pytest.mark.parametrize(("out_features", "in_features"), SHAPES)
def test_kernel_equals_float64_product_of_the_same_quantized_values(
    kernels: NativeKernels, out_features: int, in_features: int, two_term: bool
) -> None:
    int4, int8 = weights(out_features, in_features, seed=out_features)
    # half a step of the block's scale at most: amax / 254, or / 254^2 with the residual term
    step = 254 * 254 if two_term else 254
    for num_rows in ROW_COUNTS:
        x = torch.randn(num_rows, in_features, generator=torch.Generator().manual_seed(num_rows)) * 3
        rows = kernels.quantize_rows(x, two_term)
        assert (rows.dequantize() - x).abs().max() <= x.abs().max() / step * 1.01
        for bits, weight, packed in ((4, int4, pack_int4(int4)), (8, int8, pack_int8(int8))):
            got = kernels.matmul(packed, bits, rows, out_features).double()
            want = rows.dequantize().double() @ weight.dequantize().double().T
            # float32 sums over in/32 blocks: a few ulps of the largest partial sums
            tolerance = 1e-5 * (rows.dequantize().abs().double() @ weight.dequantize().abs().double().T).max()
            assert (got - want).abs().max() <= tolerance, (bits, num_rows)


@pytest.mark.parametrize("two_term", [True, False])
def test_a_row_is_the_same_bits_alone_beside_others_and_on_two_threads(kernels: NativeKernels, two_term: bool) -> None:
    int4, int8 = weights(960, 576, seed=1)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(2))
    for bits, packed in ((4, pack_int4(int4)), (8, pack_int8(int8))):
        together = kernels.matmul(packed, bits, kernels.quantize_rows(x, two_term), 960)
        on_two = kernels.matmul(packed, bits, kernels.quantize_rows(x, two_term), 960, threads=2)
        assert torch.equal(together, on_two)
        for row in (0, 5, 36):
            alone = kernels.matmul(packed, bits, kernels.quantize_rows(x[row : row + 1].contiguous(), two_term), 960)
            assert torch.equal(alone[0], together[row]), (bits, row)


def test_gguf_scales_are_kept_exactly_and_float_ones_rounded_to_fp16() -> None:
    q = torch.randint(0, 16, (16, 64), dtype=torch.uint8)
    fp16_scales = torch.rand(16, 2).half().float()
    from_file = Int4Weight(q, fp16_scales, -8 * fp16_scales)  # a Q4_0 tensor as the GGUF loader gives it
    kept = as_native_sees(from_file)
    assert isinstance(kept, Int4Weight)
    assert torch.equal(kept.scales, from_file.scales) and torch.equal(kept.mins, from_file.mins)
    rounded = as_native_sees(Int4Weight(q, fp16_scales + 1e-6, -8 * fp16_scales))
    assert isinstance(rounded, Int4Weight) and torch.equal(rounded.scales, rounded.scales.half().float())


def test_per_row_int8_scales_spread_over_blocks_of_32() -> None:
    weight = quantize_int8(torch.randn(20, 96))
    assert weight.group_size == 96
    seen = as_native_sees(weight)
    assert seen.group_size == 32 and seen.scales.shape == (20, 3)
    assert torch.allclose(seen.dequantize(), weight.dequantize(), rtol=1e-3)
