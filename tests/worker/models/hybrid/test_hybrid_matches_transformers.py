"""The hybrid decoder against the transformers oracle (float32): logits within 1e-4, greedy runs identical."""

from __future__ import annotations

import pytest
import torch
import transformers

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, make_tiny_hybrid_model
from worker.engine.runner import ModelRunner
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.loader import LoadedModel, load_model

NUM_TOKENS = 150  # more than two of the chunked delta rule's 64-token chunks


CASES = {family: dict(family=family) for family in HYBRID_FAMILIES} | {
    "qwen3_5_text-tied": dict(family="qwen3_5_text", tie_word_embeddings=True),  # the small Qwen3.5s tie
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny_pair(request, tmp_path_factory) -> tuple[LoadedModel, transformers.PreTrainedModel]:
    options = dict(CASES[request.param])
    family = options.pop("family")
    folder = make_tiny_hybrid_model(tmp_path_factory.mktemp(request.param), family, **options)
    ours = load_model(folder, dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ours, theirs


def _random_ids(model: LoadedModel, num: int, seed: int = 1) -> list[int]:
    return torch.randint(0, model.config.vocab_size, (num,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference_logits(theirs, token_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return theirs(torch.tensor([token_ids])).logits[0]  # [T, vocab]


def test_loads_as_a_hybrid_decoder(tiny_pair):
    ours, _ = tiny_pair
    assert isinstance(ours.decoder, HybridDecoder)
    assert ours.extra_tensors == {}  # every checkpoint tensor has its owner


def test_one_forward_matches_transformers(tiny_pair):
    ours, theirs = tiny_pair
    token_ids = _random_ids(ours, NUM_TOKENS)
    cache = ours.decoder.new_cache(256)
    logits = ours.decoder(torch.tensor(token_ids), torch.arange(NUM_TOKENS), cache).logits
    expected = _reference_logits(theirs, token_ids)
    assert torch.allclose(logits, expected, atol=1e-4, rtol=0), (logits - expected).abs().max()


def test_prefill_chunks_then_decode_steps_match_transformers(tiny_pair):
    """Chunks without logits (chunked delta rule, state carried between chunks), then one-token
    steps (the recurrent form): every step's logits are transformers' at that position."""
    ours, theirs = tiny_pair
    token_ids = _random_ids(ours, 100, seed=2)
    expected = _reference_logits(theirs, token_ids)
    cache = ours.decoder.new_cache(128)
    start = 0
    for size in (70, 13, 7):  # odd sizes; the first spans a chunk boundary of the chunked form
        ours.decoder(
            torch.tensor(token_ids[start : start + size]), torch.arange(start, start + size), cache, num_logits=0
        )
        cache.commit(size)
        start += size
    steps = []
    for position in range(start, len(token_ids)):
        steps.append(ours.decoder(torch.tensor([token_ids[position]]), torch.tensor([position]), cache).logits)
        cache.commit(1)
    logits = torch.cat(steps)
    assert torch.allclose(logits, expected[start:], atol=1e-4, rtol=0), (logits - expected[start:]).abs().max()


def test_greedy_run_through_the_runner_matches_transformers_generate(tiny_pair):
    ours, theirs = tiny_pair
    prompt = [5, 17, 42, 99, 7, 3, 11, 60, 2]
    with torch.no_grad():
        expected = theirs.generate(
            torch.tensor([prompt]),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    runner = ModelRunner(ours.decoder, ours.checkpoint.eos_token_ids)
    sequence = runner.start("greedy", prompt, SamplingParams(max_tokens=64, ignore_eos=True))
    while sequence.num_to_prefill:
        runner.prefill(sequence, max_chunk=5)
    while not sequence.finished:
        runner.decode_step(sequence)
    assert sequence.output_ids == expected
    assert len(set(expected)) > 8  # a run that explores, not one token repeated


def test_requested_hidden_states_are_layer_outputs(tiny_pair):
    ours, theirs = tiny_pair
    token_ids = [3, 8, 13, 21, 34]
    cache = ours.decoder.new_cache(16)
    out = ours.decoder(torch.tensor(token_ids), torch.arange(5), cache, hidden_layers=(0, 2), want_final_hidden=True)
    with torch.no_grad():
        reference = theirs(torch.tensor([token_ids]), output_hidden_states=True).hidden_states
    # transformers' hidden_states[i + 1] is the output of layer i; the last one is after the final norm
    # (the residual stream grows to ~20 in these scaled-up random models: 1e-4 is float32 rounding)
    assert torch.allclose(out.hidden[0], reference[1][0], atol=1e-4)
    assert torch.allclose(out.hidden[2], reference[3][0], atol=1e-4)
    assert torch.allclose(out.final_hidden, reference[-1][0], atol=1e-4)
