"""GGUF Q4_0 / Q4_1 / Q8_0 blocks read without dequantizing, then dequantized bit for bit like `gguf`."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from worker.kernels.quantized_weight import Int4Weight, Int8Weight
from worker.models.gguf_blocks import read_blocks

Q = gguf.GGMLQuantizationType


def random_blocks(qtype: Q, rows: int = 48, cols: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Quantized bytes of an N(0, 1) matrix with a few large outliers (exercising big scales), and its float."""
    rng = np.random.default_rng(seed)
    weight = rng.standard_normal((rows, cols), dtype=np.float32)
    weight[rng.integers(0, rows, 5), rng.integers(0, cols, 5)] *= 40
    return gguf.quants.quantize(weight, qtype), weight


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_blocks_dequantize_exactly_like_gguf(qtype: Q) -> None:
    blocks, weight = random_blocks(qtype)
    ours = read_blocks(blocks, qtype, weight.shape)
    expected = gguf.quants.dequantize(blocks, qtype)
    assert np.array_equal(ours.dequantize().numpy(), expected)


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_four_bit_blocks_become_int4_groups_of_32(qtype: Q) -> None:
    blocks, weight = random_blocks(qtype)
    ours = read_blocks(blocks, qtype, weight.shape)
    assert isinstance(ours, Int4Weight) and ours.group_size == 32
    assert ours.q.dtype == torch.uint8 and int(ours.q.max()) <= 15
    assert ours.scales.shape == (48, 3) and ours.mins.shape == (48, 3)
    if qtype == Q.Q4_0:  # symmetric around q = 8: the kernels' zero is 0
        assert torch.equal(ours.kernel_zeros(), torch.zeros_like(ours.scales))


def test_q8_0_blocks_become_int8_groups_of_32() -> None:
    blocks, weight = random_blocks(Q.Q8_0)
    ours = read_blocks(blocks, Q.Q8_0, weight.shape)
    assert isinstance(ours, Int8Weight) and ours.group_size == 32 and ours.scales.shape == (48, 3)


def test_row_permutation_moves_whole_rows_of_groups() -> None:
    blocks, weight = random_blocks(Q.Q4_1)
    ours = read_blocks(blocks, Q.Q4_1, weight.shape)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ours.rows(order).dequantize(), ours.dequantize()[order])
