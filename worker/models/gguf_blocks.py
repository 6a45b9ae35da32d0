"""GGUF's Q4_0, Q4_1 and Q8_0 blocks read into `Int4Weight` / `Int8Weight` without dequantizing.

A block covers 32 consecutive values of a row (ggml-common.h):
  Q4_0: d (float16), 16 bytes of nibbles        value = (q - 8) * d
  Q4_1: d, m (float16), 16 bytes of nibbles     value = q * d + m
  Q8_0: d (float16), 32 int8                    value = q * d
Byte j of a 4-bit block holds value j in its low nibble and value j + 16 in its high one.
"""

from __future__ import annotations

import gguf
import numpy as np
import torch

from worker.kernels.quantized_weight import Int4Weight, Int8Weight, QuantizedWeight

_QTYPE = gguf.GGMLQuantizationType
BLOCK_SIZE = 32
QUANTIZED_TYPES = frozenset({_QTYPE.Q4_0, _QTYPE.Q4_1, _QTYPE.Q8_0})


def read_blocks(data: np.ndarray, qtype: gguf.GGMLQuantizationType, shape: tuple[int, int]) -> QuantizedWeight:
    """`data`: the tensor's raw bytes (GGUFReader's view); `shape`: [rows, cols] as HF stores it."""
    rows, cols = shape
    _, type_size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = np.asarray(data).reshape(rows * cols // BLOCK_SIZE, type_size)  # [num_blocks, bytes]
    groups = (rows, cols // BLOCK_SIZE)
    scales = _halves(blocks[:, 0:2]).reshape(groups)
    if qtype == _QTYPE.Q8_0:
        codes = torch.from_numpy(blocks[:, 2:].copy().view(np.int8)).reshape(rows, cols)
        return Int8Weight(codes, scales, BLOCK_SIZE)
    if qtype == _QTYPE.Q4_1:
        mins = _halves(blocks[:, 2:4]).reshape(groups)
    else:
        assert qtype == _QTYPE.Q4_0, qtype
        mins = -8 * scales  # exact: -8 d is a float16 times a power of two
    nibbles = blocks[:, 4:] if qtype == _QTYPE.Q4_1 else blocks[:, 2:]
    q = np.concatenate((nibbles & 0x0F, nibbles >> 4), axis=1)  # [num_blocks, 32]
    return Int4Weight(torch.from_numpy(q).reshape(rows, cols), scales, mins, BLOCK_SIZE)


def _halves(raw: np.ndarray) -> torch.Tensor:
    """[num_blocks, 2] bytes -> [num_blocks] float32 (from float16, exactly)."""
    return torch.from_numpy(np.ascontiguousarray(raw).view(np.float16).astype(np.float32).reshape(-1))
