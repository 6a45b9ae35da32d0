"""Every quantized linear equals dequantize-then-matmul, at every row count a speculating worker uses.

The reference multiplies the same bfloat16 input by the weight the kernel holds (`as_kernel_sees`:
scales rounded to bfloat16) in float64. The kernels return bfloat16, so the stated tolerance is
bfloat16's rounding of the result, 2^-8 of the largest output, plus float32 accumulation:
2^-7 of the largest output. A wrong zero convention, nibble order or scale layout is off by
whole quantization steps, far beyond it.
"""

from __future__ import annotations

import pytest
import torch

from worker.kernels.quantized_weight import Int4Weight, Int8Weight, quantize_int4, quantize_int8
from worker.models.planned_linear import PlannedLinear
from worker.models.quantized_linear import QuantizedLinear
from worker.models.weight_packing import KERNEL_DTYPE, as_kernel_sees

ROW_COUNTS = (1, 2, 3, 4, 5, 8, 16, 33)
TOLERANCE = 2**-7  # of the largest |output|


def random_weight(rows: int = 96, cols: int = 128, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=generator) + 0.3 * torch.rand(rows, 1, generator=generator)


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.to(KERNEL_DTYPE).double() @ weight.double().t()
    return out if bias is None else out + bias.double()


def assert_close(out: torch.Tensor, expected: torch.Tensor) -> None:
    error = (out.double() - expected).abs().max().item()
    assert error <= TOLERANCE * expected.abs().max().item(), error


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("num_rows", ROW_COUNTS)
@pytest.mark.parametrize("with_bias", [False, True])
def test_quantized_linear_equals_dequantized_matmul(kind: str, num_rows: int, with_bias: bool) -> None:
    weight = random_weight()
    quantized = quantize_int4(weight) if kind == "int4" else quantize_int8(weight)
    bias = torch.randn(96) if with_bias else None
    layer = QuantizedLinear(quantized, bias, "cpu")
    x = torch.randn(num_rows, 128)
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == (num_rows, 96)
    assert_close(out, reference(x, as_kernel_sees(quantized).dequantize(), bias))


def test_int4_kernel_zero_is_the_value_of_q_8() -> None:
    """The CPU kernel computes (q - 8) * scale + zero: a weight of all-8 codes is exactly its zeros."""
    q = torch.full((64, 64), 8, dtype=torch.uint8)
    scales = torch.full((64, 2), 0.5)
    mins = torch.linspace(-2, 2, 128).view(64, 2)  # zeros = mins + 4
    layer = QuantizedLinear(Int4Weight(q, scales, mins), None, "cpu")
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 40] = 1.0, 1.0  # picks group 0 and group 1 of every row
    expected = (mins + 8 * scales).sum(dim=1)  # [64]
    assert torch.allclose(layer(x)[0], expected.to(KERNEL_DTYPE).float(), rtol=2**-7)


def test_quantization_error_is_within_half_a_step() -> None:
    weight = random_weight()
    int4 = quantize_int4(weight)
    step4 = int4.scales.repeat_interleave(32, dim=1)  # [out, in]
    assert ((int4.dequantize() - weight).abs() <= step4 / 2 + 1e-6).all()
    int8 = quantize_int8(weight)
    assert ((int8.dequantize() - weight).abs() <= int8.scales / 2 + 1e-6).all()


def test_int8_groups_requantize_per_channel_within_half_a_row_step() -> None:
    weight = random_weight()
    q8_0 = quantize_int8(weight.view(-1, 32))  # one scale per 32 values: Q8_0's layout
    blocks = Int8Weight(q8_0.q.view(96, 128), q8_0.scales.view(96, 4), 32)
    channel = blocks.per_channel()
    assert channel.group_size == 128
    assert ((channel.dequantize() - blocks.dequantize()).abs() <= channel.scales / 2 + 1e-6).all()


def test_planned_linear_serves_every_row_count_in_its_one_format() -> None:
    int4 = quantize_int4(random_weight())
    quantized = QuantizedLinear(int4, None, "cpu")
    layer = PlannedLinear(quantized, "int4", 128, 96)
    x = torch.randn(40, 128)
    for num_rows in (1, 2, 3, 5, 8, 17, 40):  # the same kernel, whatever the rows: no plan switches it
        out = layer(x[:num_rows])
        assert torch.equal(out, quantized(x[:num_rows])), num_rows
        # and torch's int4 kernel gives a row the same bits alone as beside others
        assert torch.equal(out[:1], layer(x[:1])), num_rows
    assert layer.weight_formats == ("int4",) and layer.impls == {"int4": quantized}
