"""Packing quantized weights for PyTorch's weight-only kernels, and calling them, per device.

CPU (measured on an AVX-512 EPYC, torch 2.13, one thread; tests/worker/models pins the numerics):
  `_weight_int4pack_mm_for_cpu` and `_weight_int8pack_mm` have fast paths for bfloat16
  activations only. With float32 (or float16) activations both fall to a scalar loop, 15-40x
  slower (int4, 1536x576, one row: 2.2 ms in float32 vs 0.05-0.16 ms in bfloat16). So on CPU the
  kernels always run in bfloat16, whatever the model's activation dtype.
CUDA (tinygemm, `_weight_int4pack_mm`): bfloat16 activations, the weight packed from [out, in/2]
  uint8 (two values per byte, even column in the high nibble) with innerKTiles 8 (or 4, 2 where
  in_features asks); int8 through
  `_weight_int8pack_mm` where the build has it. Not runnable here; tests/gpu/ checks it on a GPU.

Scales and zeros travel in the kernel's activation dtype ([in/group, out, 2] for int4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.kernels.quantized_weight import INT4_KERNEL_OFFSET, Int4Weight, Int8Weight

KERNEL_DTYPE = torch.bfloat16  # the one activation dtype both kernels are fast in, on CPU and CUDA
CUDA_INNER_K_TILES = 8
CPU_ROW_MULTIPLE, CUDA_ROW_MULTIPLE = 16, 8  # out_features the int4 packers accept


@dataclass(slots=True)
class PackedInt4:
    packed: torch.Tensor  # the kernel's layout (device specific)
    scales_and_zeros: torch.Tensor  # [in // group, out, 2] bfloat16
    group_size: int
    out_features: int

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] bfloat16 -> [T, out] bfloat16."""
        if x.device.type == "cuda":
            out = torch.ops.aten._weight_int4pack_mm(x, self.packed, self.group_size, self.scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_and_zeros)
        return out if out.shape[1] == self.out_features else out[:, : self.out_features]

    @property
    def num_bytes(self) -> int:
        return _bytes(self.packed) + _bytes(self.scales_and_zeros)


@dataclass(slots=True)
class PackedInt8:
    q: torch.Tensor  # [out, in] int8 (the kernel reads it as it is)
    scales: torch.Tensor  # [out] bfloat16

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.q, self.scales)  # [T, out]

    @property
    def num_bytes(self) -> int:
        return _bytes(self.q) + _bytes(self.scales)


def pack_int4(weight: Int4Weight, device: torch.device | str) -> PackedInt4:
    """Rows are padded with zero rows to the kernels' multiple (16 on CPU, 8 on CUDA); `matmul`
    cuts the padding off its output."""
    device = torch.device(device)
    out_features = weight.shape[0]
    weight = _padded_rows(weight, -out_features % (CUDA_ROW_MULTIPLE if device.type == "cuda" else CPU_ROW_MULTIPLE))
    q = weight.q.to(device)
    if device.type == "cuda":
        nibbles = (q[:, ::2] << 4 | q[:, 1::2]).contiguous()  # [out, in / 2] uint8
        packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, cuda_inner_k_tiles(weight.shape[1]))
    else:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    scales_and_zeros = torch.stack((weight.scales, weight.kernel_zeros()), dim=-1).transpose(0, 1)  # [groups, out, 2]
    sz = scales_and_zeros.contiguous().to(device=device, dtype=KERNEL_DTYPE)
    return PackedInt4(packed, sz, weight.group_size, out_features)


def cuda_inner_k_tiles(in_features: int) -> int:
    """tinygemm wants in_features a multiple of innerKTiles * 16: the largest of 8, 4, 2 that fits
    (SmolLM2's 576 takes 4, an 8B model's 4096 takes 8)."""
    for tiles in (CUDA_INNER_K_TILES, 4, 2):
        if in_features % (tiles * 16) == 0:
            return tiles
    raise ValueError(f"in_features={in_features} is not a multiple of 32: no int4 layout on CUDA")


def _padded_rows(weight: Int4Weight, num_rows: int) -> Int4Weight:
    if num_rows == 0:
        return weight

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat((tensor, tensor.new_zeros(num_rows, tensor.shape[1])))

    return Int4Weight(pad(weight.q), pad(weight.scales), pad(weight.mins), weight.group_size)


def pack_int8(weight: Int8Weight, device: torch.device | str) -> PackedInt8:
    weight = weight.per_channel()
    scales = weight.scales.view(-1).to(device=device, dtype=KERNEL_DTYPE)  # [out]
    return PackedInt8(weight.q.to(device).contiguous(), scales)


def as_kernel_sees(weight: Int4Weight | Int8Weight) -> Int4Weight | Int8Weight:
    """`weight` as the kernel multiplies by it: int8 per channel, scales (and int4's zeros) rounded
    to the kernel's dtype."""
    if isinstance(weight, Int8Weight):
        channel = weight.per_channel()
        return Int8Weight(channel.q, _rounded(channel.scales), channel.group_size)
    scales, zeros = _rounded(weight.scales), _rounded(weight.kernel_zeros())
    return Int4Weight(weight.q, scales, zeros - INT4_KERNEL_OFFSET * scales, weight.group_size)


def _rounded(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to(KERNEL_DTYPE).to(tensor.dtype)


def _bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()
