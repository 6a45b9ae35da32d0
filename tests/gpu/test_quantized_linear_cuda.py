"""On CUDA: every quantized linear equals dequantize-then-matmul (tinygemm int4, int8 weight-only).

The same statement and tolerance as tests/worker/models/test_quantized_linear.py, on the GPU
kernels: the bfloat16 input times the weight the kernel holds (as_kernel_sees), in float64;
the result is bfloat16, so 2^-7 of the largest output. Skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from worker.kernels.quantized_weight import quantize_int4, quantize_int8
from worker.models.quantized_linear import QuantizedLinear
from worker.models.weight_packing import KERNEL_DTYPE, as_kernel_sees

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TOLERANCE = 2**-7
SHAPES = [(96, 576), (1536, 576), (576, 1536), (4096, 4096), (200, 128)]  # 200: rows padded to 8


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("num_rows", [1, 2, 4, 16, 64])
def test_cuda_quantized_linear_equals_dequantized_matmul(kind: str, shape: tuple[int, int], num_rows: int) -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(*shape, generator=generator)
    quantized = quantize_int4(weight) if kind == "int4" else quantize_int8(weight)
    bias = torch.randn(shape[0], generator=generator)
    layer = QuantizedLinear(quantized, bias.cuda(), "cuda")
    x = torch.randn(num_rows, shape[1], generator=generator).cuda()
    out = layer(x)
    assert out.device.type == "cuda" and out.dtype == torch.float32 and out.shape == (num_rows, shape[0])
    expected = x.to(KERNEL_DTYPE).double().cpu() @ as_kernel_sees(quantized).dequantize().double().t() + bias.double()
    error = (out.double().cpu() - expected).abs().max().item()
    assert error <= TOLERANCE * expected.abs().max().item(), error


def test_cuda_and_cpu_int4_kernels_agree() -> None:
    """One packed weight, two devices: the same values (both kernels share tinygemm's rule)."""
    weight = torch.randn(512, 256, generator=torch.Generator().manual_seed(1))
    int4 = quantize_int4(weight)
    x = torch.randn(3, 256)
    cpu, gpu = QuantizedLinear(int4, None, "cpu")(x), QuantizedLinear(int4, None, "cuda")(x.cuda()).cpu()
    assert (cpu - gpu).abs().max().item() <= TOLERANCE * cpu.abs().max().item()
