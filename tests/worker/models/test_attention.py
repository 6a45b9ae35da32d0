"""Grouped attention in row blocks: the same result as the unsplit form, every buffer under the budget."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.models import attention
from worker.models.attention import MAX_SCORE_BYTES, grouped_attention, plain_fits, rows_per_block
from worker.models.decoder import attention_mask
from worker.models.loader import load_model

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


class _OpRecorder(TorchDispatchMode):
    """Every aten op a call runs, with the shape of what it returns and the bytes it allocated
    (0 for a view: a transposed or sliced tensor holds no memory of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...], int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        out = result[0] if isinstance(result, tuple) else result  # the fused kernel returns (out, logsumexp)
        if isinstance(out, torch.Tensor):
            inputs = [a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)]
            is_view = out.untyped_storage().data_ptr() in inputs
            allocated = 0 if is_view else out.numel() * out.element_size()
            self.ops.append((str(func), tuple(out.shape), allocated))
        return result


@contextmanager
def _recording() -> Iterator[_OpRecorder]:
    recorder = _OpRecorder()
    with recorder:
        yield recorder


def _qkv(num_rows: int, num_keys: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(HEADS, num_rows, HEAD_DIM, generator=g, dtype=torch.float64)
    keys = torch.randn(KV_HEADS, num_keys, HEAD_DIM, generator=g, dtype=torch.float64)
    values = torch.randn(KV_HEADS, num_keys, HEAD_DIM, generator=g, dtype=torch.float64)
    return q, keys, values


def _tree_mask(num_rows: int) -> torch.Tensor:
    """[T, T]: a tree where node i's parent is (i - 1) // 2 (a binary tree, ancestors + self)."""
    mask = torch.eye(num_rows, dtype=torch.bool)
    for node in range(1, num_rows):
        mask[node] |= mask[(node - 1) // 2]
    return mask


def test_the_plain_form_runs_while_its_scores_fit_the_budget():
    # 4 heads x 4,096 keys x 8 B = 128 KB a row in float64: a 512-row chunk is 64 MB
    assert plain_fits(4, 512, 4096, torch.float64, MAX_SCORE_BYTES)
    assert not plain_fits(4, 512, 4097, torch.float64, MAX_SCORE_BYTES)
    assert not plain_fits(4, 1024, 8192, torch.bfloat16, MAX_SCORE_BYTES)  # the softmax's float32 counts
    assert plain_fits(4, 1, 262144 * 64, torch.float64, MAX_SCORE_BYTES)  # one row: decode, whatever its length


def test_a_fused_block_keeps_its_float_mask_under_the_budget():
    # a [rows, 262,144] float64 mask is 2 MB a row: 32 rows in 64 MB
    assert rows_per_block(512, 262144, torch.float64, MAX_SCORE_BYTES) == 32
    assert rows_per_block(512, 262144, torch.float32, MAX_SCORE_BYTES) == 64
    assert rows_per_block(20, 262144, torch.float32, MAX_SCORE_BYTES) == 20
    assert rows_per_block(512, 262144, torch.float64, 1000) == 1  # never less than a row


@pytest.mark.parametrize("case", ["causal", "tree", "none"])
def test_split_rows_give_the_unsplit_result(case):
    num_rows, start = 37, 150
    q, keys, values = _qkv(num_rows, start + num_rows)
    tree = _tree_mask(num_rows) if case == "tree" else None
    mask = None if case == "none" else attention_mask(start, num_rows, tree, torch.device("cpu"))
    whole = grouped_attention(q, keys, values, mask, max_score_bytes=1 << 40)
    mask_row_bytes = (start + num_rows) * 8
    split = grouped_attention(q, keys, values, mask, max_score_bytes=5 * mask_row_bytes)  # blocks of 5, then 2
    assert torch.allclose(split, whole, atol=1e-13, rtol=0), (split - whole).abs().max()
    # each row is its own attention: a row computed alone is that row of the whole
    alone = grouped_attention(q[:, 36:37], keys, values, None if mask is None else mask[36:37])
    assert torch.allclose(alone[:, 0], whole[:, 36], atol=1e-13, rtol=0)
    if case == "tree":  # the mask reached each block's rows: node 36 sees only its ancestors' keys
        assert not torch.allclose(whole[:, 36], grouped_attention(q, keys, values, None)[:, 36])


def test_no_buffer_exceeds_the_budget():
    num_rows, num_keys = 64, 3000
    q, keys, values = _qkv(num_rows, num_keys)
    mask = attention_mask(num_keys - num_rows, num_rows, None, torch.device("cpu"))
    budget = 6 * num_keys * 8  # six rows of a float64 mask; the plain form's scores would be 6 MB
    with _recording() as recorded:
        grouped_attention(q, keys, values, mask, max_score_bytes=budget)
    largest = max(nbytes for _, _, nbytes in recorded.ops)
    assert largest <= budget, f"a buffer of {largest:,} B; budget {budget:,} B"
    fused = [shape for op, shape, _ in recorded.ops if "scaled_dot_product" in op]
    assert [shape[2] for shape in fused] == [6] * 10 + [4]  # 64 rows: ten blocks of 6, then 4


def test_one_row_runs_the_unsplit_ops_only():
    q, keys, values = _qkv(1, 262144 // 64)
    with _recording() as split_form:
        grouped_attention(q, keys, values, None, max_score_bytes=1)  # no buffer fits: one row still runs plain
    with _recording() as plain_form:
        attention._attend(q, keys, values, None)
    assert [op for op, _, _ in split_form.ops] == [op for op, _, _ in plain_form.ops]


def test_gated_attention_of_a_hybrid_attends_in_blocks(tmp_path, monkeypatch):
    folder = make_tiny_hybrid_model(tmp_path / "tiny", "qwen3_5_text")
    decoder = load_model(folder, dtype=torch.float64).decoder
    prompt = torch.randint(0, 300, (120,), generator=torch.Generator().manual_seed(1))

    def prefill_logits() -> torch.Tensor:
        cache = decoder.new_cache(len(prompt))
        return decoder(prompt, torch.arange(len(prompt)), cache).logits

    with torch.inference_mode():
        whole = prefill_logits()
        monkeypatch.setattr(attention, "MAX_SCORE_BYTES", 7 * 120 * 8)  # a [7, 120] float64 mask a block
        with _recording() as recorded:
            split = prefill_logits()
    fused = [shape for op, shape, _ in recorded.ops if "scaled_dot_product" in op]
    assert [shape[2] for shape in fused] == [7] * 17 + [1], fused  # [1, heads, rows, d]: 120 rows
    assert torch.allclose(split, whole, atol=1e-10, rtol=0), (split - whole).abs().max()
