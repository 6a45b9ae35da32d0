"""Quantized weights re-laid out for the native kernels (the record layout native/quant_dot.c documents).

Output rows go in tiles of 16 (one 512-bit register of sums); per (tile, block of 32 inputs) one
record: the tile's quantized values, then its scales as fp16 (and the int4 minimums, or the int8
correction term). GGUF stores scales and minimums in fp16, so a Q4_0/Q4_1/Q8_0 weight is held
exactly; a weight quantized here from floats has its scales rounded to fp16 (`as_native_sees`).
"""

from __future__ import annotations

import torch

from worker.kernels.native_lib import QK, TILE
from worker.kernels.quantized_weight import Int4Weight, Int8Weight


def as_native_sees(weight: Int4Weight | Int8Weight) -> Int4Weight | Int8Weight:
    """The values the native kernel multiplies by: scales (and minimums) rounded to fp16, groups of 32."""
    if isinstance(weight, Int4Weight):
        return Int4Weight(weight.q, _fp16(weight.scales), _fp16(weight.mins), weight.group_size)
    grouped = _grouped_int8(weight)
    return Int8Weight(grouped.q, _fp16(grouped.scales), QK)


def pack_int4(weight: Int4Weight) -> torch.Tensor:
    """[tiles, k/32, 320] uint8 from q [n, k] in 0..15 with groups of 32."""
    assert weight.group_size == QK, f"native int4 needs groups of {QK}, not {weight.group_size}"
    n, k = weight.shape
    tiles, groups = -(-n // TILE), k // QK
    q = _pad_rows(weight.q, tiles * TILE).view(tiles, TILE, groups, 2, 4, 4)  # k = 32 g + 16 half + 4 c + b
    nibbles = q[:, :, :, 0] | (q[:, :, :, 1] << 4)  # [tiles, 16, groups, 4 c, 4 b]
    values = nibbles.permute(0, 2, 3, 1, 4).reshape(tiles, groups, 256)
    scales = _tile_major(_fp16(weight.scales).to(torch.float16), tiles)  # [tiles, groups, 32] bytes
    mins = _tile_major(_fp16(weight.mins).to(torch.float16), tiles)
    return torch.cat((values, scales, mins), dim=-1).contiguous()


def pack_int8(weight: Int8Weight) -> torch.Tensor:
    """[tiles, k/32, 608] uint8 from q [n, k] int8 (any group size dividing into 32s or one per row)."""
    grouped = _grouped_int8(weight)
    n, k = grouped.shape
    tiles, groups = -(-n // TILE), k // QK
    q = _pad_rows(grouped.q, tiles * TILE).view(tiles, TILE, groups, 8, 4)
    values = q.permute(0, 2, 3, 1, 4).reshape(tiles, groups, 512).view(torch.uint8)
    scales = _tile_major(_fp16(grouped.scales).to(torch.float16), tiles)
    correction = (-128 * grouped.q.view(n, groups, QK).to(torch.int32).sum(-1)).to(torch.int32)  # [n, groups]
    return torch.cat((values, scales, _tile_major(correction, tiles)), dim=-1).contiguous()


def _grouped_int8(weight: Int8Weight) -> Int8Weight:
    n, k = weight.shape
    if weight.group_size == QK:
        return weight
    assert weight.group_size % QK == 0, f"int8 groups of {weight.group_size} do not split into {QK}s"
    scales = weight.scales.repeat_interleave(weight.group_size // QK, dim=1)  # [n, k / 32]
    return Int8Weight(weight.q, scales, QK)


def _fp16(values: torch.Tensor) -> torch.Tensor:
    return values.to(torch.float16).to(torch.float32)


def _tile_major(per_row: torch.Tensor, tiles: int) -> torch.Tensor:
    """[n, groups] of any 2- or 4-byte dtype -> [tiles, groups, 16 x itemsize] bytes."""
    padded = _pad_rows(per_row, tiles * TILE)
    groups = padded.shape[1]
    arranged = padded.view(tiles, TILE, groups).transpose(1, 2).contiguous()  # [tiles, groups, 16]
    return arranged.view(torch.uint8).view(tiles, groups, -1)


def _pad_rows(values: torch.Tensor, rows: int) -> torch.Tensor:
    missing = rows - values.shape[0]
    if missing == 0:
        return values.contiguous()
    return torch.cat((values, values.new_zeros(missing, *values.shape[1:]))).contiguous()
