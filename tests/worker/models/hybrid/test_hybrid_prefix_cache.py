"""The paired prefill cache for hybrid models: an entry holds its attention layers' K/V and the
recurrent state at each of its block boundaries, so it serves any of its block prefixes.

Lanes with a common 70-token system prompt and different questions go through the real
scheduler and stepper on a tiny float64 hybrid; the oracle is the same lanes without the cache.
"""

from __future__ import annotations

import random

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.lanes_in_turn import serve_in_turn
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.loader import LoadedModel, load_model
from worker.serving import model_stepper
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.prefix_cache import PrefixCache

BLOCK = 32
SYSTEM_TOKENS = 70  # two whole cache blocks and a partial one


@pytest.fixture(scope="module", params=["qwen3_5_text", "qwen3_next"])
def model(request, tmp_path_factory) -> LoadedModel:
    folder = make_tiny_hybrid_model(tmp_path_factory.mktemp(request.param), request.param)
    return load_model(folder, dtype="float64")


def _lanes(vocab: int, num: int) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(3)
    system = [rng.randrange(3, vocab) for _ in range(SYSTEM_TOKENS)]
    lanes = []
    for index in range(num):
        length = 40 if index == 0 else rng.randint(4, 40)  # the first prompt: 110 tokens, 3 whole blocks
        question = [rng.randrange(3, vocab) for _ in range(length)]
        lanes.append((f"lane-{index}", system + question, SamplingParams(max_tokens=12, ignore_eos=True)))
    lanes.append(("again", list(lanes[0][1]), lanes[0][2]))  # the first prompt once more: a longer hit
    return lanes


def _runner(model: LoadedModel, mode: str) -> ModelRunner:
    drafter = None if mode == "none" else load_drafter(mode, model, DraftOptions())
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)


def _serve(model: LoadedModel, mode: str, lanes, cache: PrefixCache | None):
    stepper = ModelStepper(_runner(model, mode), cache)
    return serve_in_turn(stepper, lanes), stepper


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_hits_give_the_same_tokens_as_no_cache(model, mode):
    lanes = _lanes(model.config.vocab_size, 4)
    cold, _ = _serve(model, mode, lanes, cache=None)
    cache = PrefixCache(1 << 30, BLOCK)
    warm, stepper = _serve(model, mode, lanes, cache)
    assert warm == cold
    counters = stepper.counters
    assert counters.prefix_cache_hits == len(lanes) - 1  # every lane after the first shares the system prompt
    # each shares the system prompt's 2 whole blocks; the repeated first prompt all 3 of its own
    assert cache.stats.hit_tokens == 64 * (len(lanes) - 2) + 96


def test_an_entry_serves_its_shorter_block_prefixes_from_their_own_states(model):
    """The entry of a 100-token prompt holds states at 32, 64 and 96 tokens; a lane sharing only
    the 70-token system prompt resumes from the state at 64, which equals a prefill to 64."""
    lanes = _lanes(model.config.vocab_size, 1)
    cache = PrefixCache(1 << 30, BLOCK)
    stepper = ModelStepper(_runner(model, "none"), cache)
    first = stepper.start(LaneStart("first", lanes[0][1], lanes[0][2]))
    while stepper.num_to_prefill(first):
        stepper.prefill(first, 48)
    hit = cache.lookup(lanes[0][1][:SYSTEM_TOKENS] + [1, 2, 3], SYSTEM_TOKENS + 2)
    assert hit is not None and hit.num_tokens == 64
    assert sorted(hit.target.states) == [n for n in (32, 64, 96) if n <= hit.entry_tokens]
    plain = model.decoder.new_cache(128)
    model.decoder(torch.tensor(lanes[0][1][:64]), torch.arange(64), plain, num_logits=0)
    plain.commit(64)
    conv_tails, delta_states = hit.target.states[64]
    assert torch.allclose(delta_states, plain.recurrent.delta_states, atol=1e-10)
    assert torch.allclose(conv_tails, plain.recurrent.conv_tails, atol=1e-12)
    assert not first.sequence.cache.recurrent.snapshots  # prefill over: the lane lets go of them


def test_a_lane_without_the_prefill_cache_keeps_no_snapshots(model):
    stepper = ModelStepper(_runner(model, "none"))
    lane = stepper.start(LaneStart("lane", list(range(3, 103)), SamplingParams(max_tokens=4)))
    stepper.prefill(lane, 80)
    cache = lane.sequence.cache
    assert isinstance(cache, HybridCache) and cache.snapshot_every is None and not cache.recurrent.snapshots


def test_snapshots_past_their_share_thin_out_and_a_hit_uses_the_longest_state_kept(model, monkeypatch):
    """With room for one snapshot the 110-token prompt keeps only its state at 96 tokens: a lane
    sharing 70 tokens finds no state within them and prefills cold; the same prompt again
    resumes at 96. Output equals no cache either way."""
    monkeypatch.setattr(model_stepper, "SNAPSHOT_SHARE", 1e-12)  # max_snapshots = 1
    lanes = _lanes(model.config.vocab_size, 2)  # the 110-token prompt, one sharing 70 tokens, it again
    cold, _ = _serve(model, "none", lanes, cache=None)
    cache = PrefixCache(1 << 30, BLOCK)
    warm, stepper = _serve(model, "none", lanes, cache)
    assert warm == cold
    assert stepper.counters.prefix_cache_hits == 1  # only the repeat: 64 tokens have no state kept
    [entry] = cache._entries.values()
    assert sorted(entry.target.states) == [96]


def test_thinning_keeps_the_newest_and_every_other_one_before_it(model):
    cache = model.decoder.new_cache(400)
    cache.snapshot_every, cache.max_snapshots = 32, 3
    model.decoder(torch.arange(320) % 300 + 3, torch.arange(320), cache, num_logits=0)  # boundaries 32 .. 320
    cache.commit(320)
    assert sorted(cache.recurrent.snapshots) == [64, 192, 320]
