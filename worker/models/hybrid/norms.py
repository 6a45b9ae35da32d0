"""The two RMSNorms of the hybrid models, both computed in at least float32 like the reference.

- `ZeroCentredRMSNorm` (every layer norm, q/k norms, the final norm): the checkpoint stores w - 1,
  so the scale is (1 + w), and the product is taken before casting back ((x * w).to(dtype)).
- `GatedRMSNorm` (a DeltaNet layer's output, per value head): a plain RMSNorm whose output is
  multiplied by silu(z), z being a separate projection of the layer's input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # float32, or float64 for a float64 model


def _normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class ZeroCentredRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = _compute_dtype(x)
        h = _normalized(x.to(compute), self.eps) * (1.0 + self.weight.to(compute))
        return h.to(x.dtype)


class GatedRMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        compute = _compute_dtype(x)
        h = self.weight * _normalized(x.to(compute), self.eps).to(x.dtype)
        return (h * F.silu(gate.to(compute))).to(x.dtype)
