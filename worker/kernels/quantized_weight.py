"""Weight-only quantized matrices, unpacked: the values a kernel's packed layout is built from.

- `Int4Weight`: groups of `group_size` along the input dimension, asymmetric, llama.cpp's Q4_1 rule
  w[n, k] = q[n, k] * scales[n, g] + mins[n, g], g = k // group_size, q in 0..15.
  Q4_0 ((q - 8) * d) is the same with mins = -8 d. PyTorch's int4 kernels (tinygemm's convention,
  and `_weight_int4pack_mm_for_cpu`'s, checked numerically in the tests) compute
  (q - 8) * scale + zero, so their zero is mins + 8 * scales (`kernel_zeros`).
- `Int8Weight`: symmetric, w[n, k] = q[n, k] * scales[n, g], q in -128..127. One group per row is
  `_weight_int8pack_mm`'s per-channel layout; GGUF's Q8_0 has groups of 32 and is requantized
  per row for that kernel (`per_channel`, lossy: see there).

`dequantize()` in float32 reproduces `gguf.quants.dequantize` bit for bit (same products and sums
in the same order), so the float32 path built from these is the one built from the file before.
Kept unpacked (one byte per value) so rows can be permuted, selected and concatenated (the GGUF
q/k permutation, fused q/k/v) before a kernel packs them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_GROUP_SIZE = 32
INT4_KERNEL_OFFSET = 8  # the kernels' q - 8


@dataclass(slots=True)
class Int4Weight:
    q: torch.Tensor  # [out, in] uint8 in 0..15
    scales: torch.Tensor  # [out, in // group_size] float32
    mins: torch.Tensor  # [out, in // group_size] float32, the value of q == 0
    group_size: int = INT4_GROUP_SIZE

    @property
    def shape(self) -> tuple[int, int]:
        return (self.q.shape[0], self.q.shape[1])

    def dequantize(self) -> torch.Tensor:
        rows, cols = self.shape
        grouped = self.q.view(rows, cols // self.group_size, self.group_size).to(torch.float32)
        return (grouped * self.scales[..., None] + self.mins[..., None]).view(rows, cols)  # [out, in]

    def kernel_zeros(self) -> torch.Tensor:
        return self.mins + INT4_KERNEL_OFFSET * self.scales  # [out, groups]

    def rows(self, index: torch.Tensor) -> Int4Weight:
        """The weight of rows `index` (a permutation or a subset), in that order."""
        return Int4Weight(self.q[index], self.scales[index], self.mins[index], self.group_size)


@dataclass(slots=True)
class Int8Weight:
    q: torch.Tensor  # [out, in] int8
    scales: torch.Tensor  # [out, in // group_size] float32
    group_size: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.q.shape[0], self.q.shape[1])

    def dequantize(self) -> torch.Tensor:
        rows, cols = self.shape
        grouped = self.q.view(rows, cols // self.group_size, self.group_size).to(torch.float32)
        return (grouped * self.scales[..., None]).view(rows, cols)  # [out, in]

    def per_channel(self) -> Int8Weight:
        """One scale per row (the int8 kernel's layout). Exact if already so; else each row is
        requantized to its absmax / 127, an error of at most half that step per value (a group
        whose scale was the row's largest keeps its values; smaller groups lose resolution)."""
        if self.group_size == self.shape[1]:
            return self
        return quantize_int8(self.dequantize())

    def rows(self, index: torch.Tensor) -> Int8Weight:
        return Int8Weight(self.q[index], self.scales[index], self.group_size)


QuantizedWeight = Int4Weight | Int8Weight


def quantize_int4(weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE) -> Int4Weight:
    """Round-to-nearest asymmetric int4 per group: the group's min..max spans the 16 levels
    (error at most half a step, (max - min) / 30, per value)."""
    rows, cols = weight.shape
    assert cols % group_size == 0, f"in_features={cols} is not a multiple of group_size={group_size}"
    grouped = weight.detach().to(torch.float32).reshape(rows, cols // group_size, group_size)
    low, high = grouped.amin(-1), grouped.amax(-1)  # [out, groups]
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    q = torch.round((grouped - low[..., None]) / scales[..., None]).clamp(0, 15)
    return Int4Weight(q.to(torch.uint8).view(rows, cols), scales, low, group_size)


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """Symmetric int8 per output row (absmax / 127); error at most half a step per value."""
    weight = weight.detach().to(torch.float32)
    scales = (weight.abs().amax(dim=1, keepdim=True) / 127).clamp(min=torch.finfo(torch.float32).tiny)  # [out, 1]
    q = torch.round(weight / scales).clamp(-128, 127).to(torch.int8)
    return Int8Weight(q, scales, weight.shape[1])


def concat_rows(weights: list[QuantizedWeight]) -> QuantizedWeight | None:
    """One weight whose rows are those of `weights` in order (a fused q/k/v or gate/up), or None
    when they cannot share one layout (different kinds or group sizes)."""
    first = weights[0]
    if all(isinstance(w, Int4Weight) and w.group_size == first.group_size for w in weights):
        int4 = [w for w in weights if isinstance(w, Int4Weight)]
        cat = torch.cat
        return Int4Weight(
            cat([w.q for w in int4]), cat([w.scales for w in int4]), cat([w.mins for w in int4]), first.group_size
        )
    if all(isinstance(w, Int8Weight) and w.group_size == first.group_size for w in weights):
        int8 = [w for w in weights if isinstance(w, Int8Weight)]
        return Int8Weight(torch.cat([w.q for w in int8]), torch.cat([w.scales for w in int8]), first.group_size)
    return None


def dequantized(weight: torch.Tensor | QuantizedWeight) -> torch.Tensor:
    """A dense float weight from either a dense tensor (as it is) or a quantized one."""
    return weight if isinstance(weight, torch.Tensor) else weight.dequantize()
