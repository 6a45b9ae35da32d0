"""The decoder against the transformers oracle: logits within 1e-4 (float32), greedy tokens identical."""

from __future__ import annotations

import pytest
import torch
import transformers

from tests.support.tiny_models import make_tiny_model
from worker.models.loader import load_model

CASES = {
    "qwen3-gqa": dict(family="qwen3"),
    "qwen3-tied": dict(family="qwen3", tie_word_embeddings=True),
    "qwen2-bias": dict(family="qwen2"),
    "llama-tied": dict(family="llama", tie_word_embeddings=True, num_key_value_heads=4),
    "llama-llama3-rope": dict(
        family="llama",
        rope_scaling=dict(
            rope_type="llama3",
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "llama-linear-rope": dict(family="llama", rope_scaling=dict(rope_type="linear", factor=4.0)),
    "qwen3-yarn-rope": dict(
        family="qwen3", rope_scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=128)
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def tiny_pair(request, tmp_path_factory):
    options = dict(CASES[request.param])
    family = options.pop("family")
    folder = make_tiny_model(tmp_path_factory.mktemp(request.param), family, **options)
    ours = load_model(folder, dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ours, theirs


def _our_logits(model, token_ids: list[int], chunks: list[int]) -> torch.Tensor:
    """Run the prompt through the cache in the given chunk sizes; all logits concatenated."""
    cache = model.decoder.new_cache(256)
    pieces, start = [], 0
    for size in chunks:
        ids = torch.tensor(token_ids[start : start + size])
        positions = torch.arange(start, start + size)
        pieces.append(model.decoder(ids, positions, cache).logits)
        cache.commit(size)
        start += size
    return torch.cat(pieces)


def test_logits_match_transformers(tiny_pair):
    ours, theirs = tiny_pair
    token_ids = torch.randint(0, ours.config.vocab_size, (150,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = theirs(torch.tensor([token_ids])).logits[0]
    one_shot = _our_logits(ours, token_ids, [150])
    chunked = _our_logits(ours, token_ids, [40, 1, 1, 60, 48])  # prefill chunks and single decode steps
    assert torch.allclose(one_shot, expected, atol=1e-4, rtol=0), (one_shot - expected).abs().max()
    assert torch.allclose(chunked, expected, atol=1e-4, rtol=0), (chunked - expected).abs().max()


def test_greedy_generation_matches_transformers(tiny_pair):
    ours, theirs = tiny_pair
    prompt = [5, 17, 42, 99, 7, 3]
    with torch.no_grad():
        expected = theirs.generate(
            torch.tensor([prompt]),
            max_new_tokens=64,
            min_new_tokens=64,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    cache = ours.decoder.new_cache(128)
    logits = ours.decoder(torch.tensor(prompt), torch.arange(len(prompt)), cache, num_logits=1).logits
    cache.commit(len(prompt))
    generated = []
    while len(generated) < 64:
        token = int(logits[-1].argmax())
        generated.append(token)
        position = cache.length
        logits = ours.decoder(torch.tensor([token]), torch.tensor([position]), cache).logits
        cache.commit(1)
    assert generated == expected


def test_hidden_states_are_layer_outputs(tiny_pair):
    ours, theirs = tiny_pair
    token_ids = [3, 8, 13, 21, 34]
    cache = ours.decoder.new_cache(16)
    out = ours.decoder(torch.tensor(token_ids), torch.arange(5), cache, hidden_layers=(0, 2), want_final_hidden=True)
    with torch.no_grad():
        reference = theirs(torch.tensor([token_ids]), output_hidden_states=True).hidden_states
    # transformers' hidden_states[i + 1] is the output of decoder layer i; the last one is after the final norm.
    assert torch.allclose(out.hidden[0], reference[1][0], atol=1e-5)
    assert torch.allclose(out.final_hidden, reference[-1][0], atol=1e-5)
