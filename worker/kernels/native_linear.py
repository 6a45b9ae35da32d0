"""A linear layer whose int4 or int8 weight runs on the native kernels (native/quant_dot.c).

The input is quantized per block of 32 (native_lib.QuantizedRows: two int8 terms, or one as llama.cpp
does with `--kernels native-int8`) and multiplied in
integers block by block; the output is float32, cast to the activation dtype. Every row is
computed on its own in a fixed order, so a row's output does not depend on the rows beside it:
the property that makes verification and plain decoding agree bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.native_lib import NativeKernels
from worker.kernels.packing import pack_int4, pack_int8
from worker.kernels.quantized_weight import Int4Weight, QuantizedWeight

# Split a product over threads only when it is big enough to pay for starting them (~20-40 us):
# the lm_head of a small model, or a prefill chunk.
MIN_OPS_PER_THREAD = 20_000_000


class NativeQuantizedLinear(nn.Module):
    def __init__(
        self,
        weight: QuantizedWeight,
        bias: torch.Tensor | None,
        kernels: NativeKernels,
        threads: int = 1,
        two_term: bool = True,
    ):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.bits = 4 if isinstance(weight, Int4Weight) else 8
        self.packed = pack_int4(weight) if isinstance(weight, Int4Weight) else pack_int8(weight)
        self.kernels = kernels
        self.threads = threads
        self.two_term = two_term  # activations to 16-bit precision in two int8 terms (native_lib.QuantizedRows)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)

    @property
    def weight_format(self) -> str:
        return f"int{self.bits}"

    @property
    def num_bytes(self) -> int:
        return self.packed.numel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # a drafter's single hidden state [in], or [..., in]
            return self.forward(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        rows = x if x.dtype == torch.float32 and x.is_contiguous() else x.to(torch.float32).contiguous()
        quantized = self.kernels.quantize_rows(rows, self.two_term)
        ops = rows.shape[0] * self.out_features * self.in_features
        threads = max(1, min(self.threads, ops // MIN_OPS_PER_THREAD))
        out = self.kernels.matmul(self.packed, self.bits, quantized, self.out_features, threads)  # [T, out]
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.weight_format} native"


def native_linear_of(module: nn.Module) -> NativeQuantizedLinear | None:
    """The first native linear inside `module` (a target's PlannedLinear or head), if any."""
    return next((m for m in module.modules() if isinstance(m, NativeQuantizedLinear)), None)
