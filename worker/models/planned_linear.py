"""A linear layer held in one or more weight formats; a decoder-wide `FormatSelector` picks one per forward.

Every format holds the same weight values (a dense alternative is the quantized weight
dequantized, with the kernel's rounded scales), so which one serves a forward changes rounding
only; row_plan.FormatSelector says which forwards may switch.
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.quantized_weight import QuantizedWeight
from worker.models.row_plan import FormatSelector


class PlannedLinear(nn.Module):
    def __init__(self, impls: dict[str, nn.Module], in_features: int, out_features: int):
        super().__init__()
        assert impls, "a PlannedLinear needs at least one format"
        # a ModuleList, not a ModuleDict: "bfloat16" and "float" are nn.Module method names
        self.weight_formats: tuple[str, ...] = tuple(impls)
        self.modules_by_format = nn.ModuleList(impls.values())
        self._forwards = [module.forward for module in impls.values()]
        self.in_features, self.out_features = in_features, out_features
        self.selector = FormatSelector(self.weight_formats)  # replaced by the decoder's shared one
        self.source: QuantizedWeight | None = None  # unpacked weight, kept by an lm_head without a dense format

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # the formats' forwards called directly: a second nn.Module __call__ per linear costs ~3 us
        return self._forwards[self.selector.index(x.numel() // self.in_features)](x)

    @property
    def impls(self) -> dict[str, nn.Module]:
        return dict(zip(self.weight_formats, self.modules_by_format, strict=True))

    def dense_weight(self) -> torch.Tensor:
        """[out, in]: a dense format's weight if this layer holds one, else `source` dequantized
        (for a drafter's vocabulary subset, which selects rows)."""
        for impl in self.modules_by_format:
            weight = getattr(impl, "weight", None)
            if isinstance(weight, torch.Tensor):
                return weight
        assert self.source is not None, "a layer without a dense format keeps its unpacked weight to give one"
        return self.source.dequantize()
