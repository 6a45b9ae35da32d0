"""A linear layer whose weight is held packed for a weight-only int4 or int8 kernel.

The kernels run in bfloat16 (weight_packing.py says why); the input is cast to it and the output
cast back, so the layer slots into a float32 (or float64) model. The bias, if any, is added after
the cast back, in the activation dtype.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.quantized_weight import Int4Weight, QuantizedWeight
from worker.models.weight_packing import KERNEL_DTYPE, PackedInt4, PackedInt8, pack_int4, pack_int8


class QuantizedLinear(nn.Module):
    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, device: torch.device | str):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel: PackedInt4 | PackedInt8 = (
            pack_int4(weight, device) if isinstance(weight, Int4Weight) else pack_int8(weight, device)
        )
        self.bias = None if bias is None else nn.Parameter(bias.to(device), requires_grad=False)

    @property
    def weight_format(self) -> str:
        return "int4" if isinstance(self.kernel, PackedInt4) else "int8"

    @property
    def num_bytes(self) -> int:
        return self.kernel.num_bytes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2:  # a drafter's single hidden state [in]
            return self.forward(x.reshape(-1, self.in_features)).view(*x.shape[:-1], self.out_features)
        rows = x if x.dtype == KERNEL_DTYPE else x.to(KERNEL_DTYPE)
        out = self.kernel.matmul(rows)  # [T, out] bfloat16
        out = out if out.dtype == x.dtype else out.to(x.dtype)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.weight_format}"
