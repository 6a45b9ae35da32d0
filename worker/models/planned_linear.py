"""A linear layer in the one weight format the rule chose for it (weight_formats.py).

It wraps the format's module (QuantizedLinear, NativeQuantizedLinear or a dense Linear) so that
every linear of a fast decoder looks alike to the decoder, the drafters (draft_vocab.py reads its
head) and the fused native layers. Every forward, of any row count, runs in that one format.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.quantized_weight import QuantizedWeight


class PlannedLinear(nn.Module):
    def __init__(self, module: nn.Module, weight_format: str, in_features: int, out_features: int):
        super().__init__()
        self.weight_format = weight_format
        self.weight_formats: tuple[str, ...] = (weight_format,)
        # a list of one, indexed by worker/kernels/fused_layers.py; a ModuleList, not a ModuleDict:
        # "bfloat16" and "float" are nn.Module method names
        self.modules_by_format = nn.ModuleList([module])
        self._forward = module.forward
        self.in_features, self.out_features = in_features, out_features
        self.source: QuantizedWeight | None = None  # unpacked weight, kept by a quantized lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the format's forward called directly: a second nn.Module __call__ per linear costs ~3 us
        return self._forward(x)

    @property
    def module(self) -> nn.Module:
        return self.modules_by_format[0]

    @property
    def impls(self) -> dict[str, nn.Module]:
        return {self.weight_format: self.module}

    def dense_weight(self) -> torch.Tensor:
        """[out, in]: the weight if this layer is dense, else `source` dequantized (for a drafter's
        vocabulary subset, which selects rows)."""
        weight = getattr(self.module, "weight", None)
        if isinstance(weight, torch.Tensor):
            return weight
        assert self.source is not None, "a quantized layer keeps its unpacked weight to give a dense one"
        return self.source.dequantize()
