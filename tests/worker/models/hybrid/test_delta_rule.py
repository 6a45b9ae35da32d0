"""The gated delta rule's two forms: each matches transformers' torch reference, and they agree
with each other (outputs, final state) from a non-zero initial state, across chunk boundaries;
in a tree each node continues its parent's state (and its conv reads its own path)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as reference

from worker.models.hybrid.delta_rule import chunked_delta_rule, recurrent_delta_rule
from worker.models.hybrid.gated_deltanet import l2_normalized
from worker.models.hybrid.recurrent_state import chain_parents, conv_columns

HEADS, DK, DV = 3, 8, 5


def _inputs(num_tokens: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(num_tokens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=dtype)

    return dict(
        q=rand(HEADS, num_tokens, DK),
        k=rand(HEADS, num_tokens, DK),
        v=rand(HEADS, num_tokens, DV),
        g=-torch.nn.functional.softplus(rand(HEADS, num_tokens)),  # log decays <= 0
        beta=torch.sigmoid(rand(HEADS, num_tokens)),
        state=rand(HEADS, DK, DV),
    )


def _ours(form, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    q, k = l2_normalized(x["q"]) * DK**-0.5, l2_normalized(x["k"])
    return form(q, k, x["v"], x["g"], x["beta"], x["state"])[:2]


def _theirs(form, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (x[name].transpose(0, 1)[None] for name in ("q", "k", "v"))  # [1, T, heads, d]
    g, beta = x["g"].t()[None], x["beta"].t()[None]
    out, state = form(
        q, k, v, g, beta, initial_state=x["state"][None], output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    return out[0].transpose(0, 1), state[0]


@pytest.mark.parametrize("num_tokens", [1, 5, 64, 150])
def test_chunked_form_matches_transformers(num_tokens):
    x = _inputs(num_tokens, torch.float32)
    out, state = _ours(chunked_delta_rule, x)
    expected_out, expected_state = _theirs(reference.torch_chunk_gated_delta_rule, x)
    assert torch.allclose(out, expected_out, atol=1e-5) and torch.allclose(state, expected_state, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [1, 7])
def test_recurrent_form_matches_transformers_and_keeps_every_state(num_tokens):
    x = _inputs(num_tokens, torch.float32)
    out, states = _ours(recurrent_delta_rule, x)
    expected_out, expected_state = _theirs(reference.torch_recurrent_gated_delta_rule, x)
    assert states.shape == (num_tokens, HEADS, DK, DV)
    assert torch.allclose(out, expected_out, atol=1e-5) and torch.allclose(states[-1], expected_state, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [3, 64, 131])
def test_the_two_forms_agree_in_float64(num_tokens):
    x = _inputs(num_tokens, torch.float64)
    chunked_out, final = _ours(chunked_delta_rule, x)
    recurrent_out, states = _ours(recurrent_delta_rule, x)
    assert torch.allclose(chunked_out, recurrent_out, atol=1e-10)
    assert torch.allclose(final, states[-1], atol=1e-10)


@pytest.mark.parametrize(("offset", "num_tokens"), [(0, 70), (5, 70), (31, 33), (20, 12)])
def test_chunks_end_at_whole_multiples_of_the_chunk_size_from_the_sequences_start(offset, num_tokens):
    """A forward starting `offset` tokens past a chunk boundary: its outputs and final state are
    unchanged by the inert padding, and each chunk's state is the recurrent state at a multiple
    of the chunk size (counted from the sequence's start)."""
    x = _inputs(num_tokens, torch.float64)
    q, k = l2_normalized(x["q"]) * DK**-0.5, l2_normalized(x["k"])
    args = (q, k, x["v"], x["g"], x["beta"], x["state"])
    out, final, chunk_states = chunked_delta_rule(*args, chunk_size=32, offset=offset, keep_chunk_states=True)
    recurrent_out, states = recurrent_delta_rule(*args)
    assert torch.allclose(out, recurrent_out, atol=1e-10) and torch.allclose(final, states[-1], atol=1e-10)
    num_chunks = -(-(offset + num_tokens) // 32)
    ends = [(chunk + 1) * 32 - offset for chunk in range(num_chunks)]  # tokens of this forward at each chunk's end
    assert chunk_states is not None and len(chunk_states) == len(ends)
    for chunk_state, end in zip(chunk_states, ends, strict=True):
        if end <= num_tokens:
            assert torch.allclose(chunk_state, states[end - 1], atol=1e-10), end


def test_a_tree_node_continues_its_parents_state():
    """Rows: root, a, b (siblings), c under b: c's state is the chain root -> b -> c's."""
    x = _inputs(4, torch.float64)
    q, k = l2_normalized(x["q"]) * DK**-0.5, l2_normalized(x["k"])
    _, tree_states = recurrent_delta_rule(q, k, x["v"], x["g"], x["beta"], x["state"], parents=[-1, 0, 0, 2])
    path = [0, 2, 3]
    _, chain_states = recurrent_delta_rule(
        q[:, path], k[:, path], x["v"][:, path], x["g"][:, path], x["beta"][:, path], x["state"]
    )
    assert torch.allclose(tree_states[path], chain_states, atol=1e-12)
    assert not torch.allclose(tree_states[1], tree_states[2])


def test_conv_columns_follow_each_tokens_path():
    assert conv_columns([-1, 0, 0], kernel=3) == [[0, 1, 2], [1, 2, 3], [1, 2, 4]]
    assert conv_columns(chain_parents(3), kernel=3) == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
