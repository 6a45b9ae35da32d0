"""An oracle drafter (the target's own greedy continuation) pins the acceptance bookkeeping:
every draft is accepted, a chain of k emits k + 1 tokens per forward, a tree with wrong
siblings emits depth + 1, and the committed KV cache is the one plain decoding builds."""

from __future__ import annotations

import functools

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.drafters.oracle import OracleDrafter, greedy_reference
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model

PROMPT = [11, 42, 7, 99, 13, 27, 64, 5]
MAX_TOKENS = 24  # a multiple of every depth + 1 below, so no step is cut short


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def model() -> LoadedModel:
    return load_model(speculation_checkpoints("qwen3").target, dtype="float64")


@functools.cache
def reference() -> list[int]:
    return greedy_reference(model().decoder, PROMPT, MAX_TOKENS + 8)


def run(drafter: OracleDrafter, prefill_chunk: int = 3) -> Sequence:
    runner = ModelRunner(model().decoder, [], drafter)
    sequence = runner.start("oracle", PROMPT, SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True))
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, prefill_chunk)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence


def oracle(depth: int, num_wrong_siblings: int = 0) -> OracleDrafter:
    return OracleDrafter(reference(), depth, model().config.vocab_size, num_wrong_siblings)


@pytest.mark.parametrize("depth", [1, 3, 5, 7])
def test_oracle_chain_is_always_accepted_and_emits_k_plus_one_per_forward(depth):
    sequence = run(oracle(depth))
    stats = sequence.stats
    assert sequence.output_ids == reference()[len(PROMPT) : len(PROMPT) + MAX_TOKENS]
    assert stats.accepted_tokens == stats.draft_tokens
    assert stats.tokens_per_forward == depth + 1
    assert stats.target_forwards == MAX_TOKENS // (depth + 1)
    assert stats.accepted_per_depth == [stats.target_forwards] * depth


@pytest.mark.parametrize(("depth", "num_wrong_siblings"), [(3, 1), (2, 3), (5, 2)])
def test_oracle_tree_accepts_its_correct_path_and_emits_depth_plus_one(depth, num_wrong_siblings):
    sequence = run(oracle(depth, num_wrong_siblings))
    stats = sequence.stats
    assert sequence.output_ids == reference()[len(PROMPT) : len(PROMPT) + MAX_TOKENS]
    assert stats.tokens_per_forward == depth + 1
    assert stats.draft_tokens == stats.target_forwards * depth * (num_wrong_siblings + 1)
    assert stats.accepted_tokens == stats.target_forwards * depth


def test_tree_commit_leaves_the_cache_plain_decoding_builds():
    # Wrong siblings sit between the correct nodes (c1 w1 c2 w2 ...), so every commit must move K/V.
    sequence = run(oracle(3, num_wrong_siblings=1))
    committed = sequence.token_ids[:-1]
    plain = model().decoder.new_cache(len(committed))
    for position, token in enumerate(committed):
        model().decoder(torch.tensor([token]), torch.tensor([position]), plain)
        plain.commit(1)
    length = sequence.cache.length
    assert length == len(committed)
    torch.testing.assert_close(sequence.cache.keys[:, :, :length], plain.keys, rtol=0, atol=1e-10)
    torch.testing.assert_close(sequence.cache.values[:, :, :length], plain.values, rtol=0, atol=1e-10)


def test_oracle_off_its_reference_proposes_nothing():
    drafter = oracle(3)
    sequence = run(drafter)
    sequence.output_ids[-1] = (sequence.output_ids[-1] + 1) % model().config.vocab_size
    assert drafter.propose(None, sequence) is None
