"""Hybrid lanes in the block pool: attention K/V in paged blocks, recurrent state in pool slots.

Lanes of tiny random Qwen3.5 and Qwen3-Next targets (float64, so batching cannot move a greedy
argmax through rounding) go through the real scheduler and stepper over a HybridPool, joining
while others run; the oracle is each request run alone with plain decoding in a buffer of its
own (HybridCache, what every hybrid lane used before the pool). Greedy and seeded lanes, every
speculation mode (the DFlash modes steered, so trees commit paths several nodes deep), with
preemption (a small pool) and with the prefill cache sharing blocks by reference.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, damp_outputs, make_tiny_hybrid_model_with_mtp
from tests.worker.models.hybrid.test_hybrid_dflash import hybrid_target, steered
from tests.worker.models.hybrid.test_hybrid_dflash import prompts as steered_prompts
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.hybrid.hybrid_pool import HybridBlocks, HybridPool, PagedHybridCache
from worker.models.loader import LoadedModel, load_model
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.prefix_cache import PrefixCache
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind

BLOCK_TOKENS = 16
CACHE_BLOCK = 32  # the prefill cache's block: two of the pool's
FAMILIES = sorted(HYBRID_FAMILIES)
MODEL_MODES = ["none", "ngram", "suffix", "mtp", "auto"]


@functools.cache
def with_head(family: str, tmp_root: str) -> LoadedModel:
    """A target with an MTP head, damped (tied embeddings, small output projections: damp_outputs)
    so that lookup drafts are accepted and also rejected part-way."""
    folder = make_tiny_hybrid_model_with_mtp(Path(tmp_root) / family, family, tie_word_embeddings=True)
    model = load_model(folder, dtype="float64")
    damp_outputs(model.decoder)
    return model


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hybrid-pool"))


def runner_for(model: LoadedModel, mode: str, drafter=None) -> ModelRunner:
    if drafter is None and mode != "none":
        drafter = load_drafter(mode, model, DraftOptions())
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)


def mixed_lanes(vocab: int, num: int, seed: int = 1) -> list[tuple[str, list[int], SamplingParams]]:
    """Greedy and seeded lanes of 24-50 prompt tokens that repeat themselves (the damped target
    falls into loops over ~40 tokens, which lookup drafts predict)."""
    rng = random.Random(seed)
    lanes = []
    for index in range(num):
        piece = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 7))]
        seeded = index % 3 == 1
        params = SamplingParams(
            max_tokens=rng.randint(30, 44),
            temperature=0.9 if seeded else 0.0,
            seed=100 + index if seeded else None,
            ignore_eos=True,
        )
        lanes.append((f"lane-{index}", (piece * 25)[: rng.randint(24, 50)], params))
    return lanes


def alone(model: LoadedModel, prompt: list[int], params: SamplingParams) -> list[int]:
    """The request alone, plain decoding, its cache a buffer of its own."""
    runner = runner_for(model, "none")
    sequence = runner.start("alone", prompt, params)
    assert isinstance(sequence.cache, HybridCache)
    while sequence.num_to_prefill:
        runner.prefill(sequence, 16)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence.output_ids


def serve(
    runner: ModelRunner,
    lanes,
    num_blocks: int,
    num_slots: int = 4,
    cache: PrefixCache | None = None,
    max_batch_tokens: int = 40,
    join_every: int = 1,
):
    """Lanes through the scheduler, one joining every `join_every` steps; returns outputs, the pool, the stepper
    and the most holders any block had while lanes ran."""
    decoder = runner.decoder
    pool = HybridPool(decoder.config, num_blocks, BLOCK_TOKENS, num_slots, decoder.dtype, decoder.device)
    stepper = ModelStepper(runner, cache, pool=pool)
    scheduler = Scheduler(stepper, SchedulerConfig(num_slots, 1 << 40, max_batch_tokens, pool.num_blocks))
    pending, outputs, most_holders, step = list(lanes), {}, 0, 0
    while pending or not scheduler.idle:
        if pending and step % join_every == 0:
            name, prompt, params = pending.pop(0)
            blocks, most = stepper.blocks_to_admit(len(prompt)), stepper.max_blocks(len(prompt), params.max_tokens)
            scheduler.submit(LaneRequest((name, 0), 0, None, LaneStart(name, prompt, params), blocks, most))
        for result in scheduler.step():
            assert result.kind is not StepKind.FAILED, result.error
            cache_of = result.state.sequence.cache
            assert isinstance(cache_of, PagedHybridCache)
            if cache_of.block_ids:
                most_holders = max(most_holders, pool.allocator.holders(cache_of.block_ids[0]))
            if result.kind is StepKind.DECODE and result.state.finished:
                outputs[result.key[0]] = list(result.state.output_ids)
                scheduler.retire(result.key)
        assert pool.states.num_free + scheduler.num_running >= pool.states.num_slots  # a slot a running lane
        step += 1
    return outputs, pool, stepper, most_holders


def assert_drained(pool: HybridPool, cache: PrefixCache | None = None) -> None:
    if cache is not None:
        cache.clear()
    assert pool.allocator.num_used == 0
    assert pool.states.num_free == pool.states.num_slots


@pytest.mark.parametrize("mode", MODEL_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_lanes_in_the_pool_give_each_requests_plain_tokens_alone(family, mode, tmp_root):
    model = with_head(family, tmp_root)
    lanes = mixed_lanes(model.config.vocab_size, 6)
    outputs, pool, stepper, _ = serve(runner_for(model, mode), lanes, num_blocks=64)
    for name, prompt, params in lanes:
        assert outputs[name] == alone(model, prompt, params), f"{name} ({params.temperature=}) differs from alone"
    counters = stepper.counters
    assert counters.preemptions == 0
    if mode == "mtp":  # the random head is never right: every step commits the root's path alone
        assert counters.draft_tokens > 0
    elif mode != "none":  # lookups are right, and wrong part-way: paths of every length committed
        assert 0 < counters.accepted_tokens < counters.draft_tokens
    assert_drained(pool)


@pytest.mark.parametrize("mode", ["dflash", "tree"])
@pytest.mark.parametrize("family", FAMILIES)
def test_steered_dflash_lanes_in_the_pool_give_plain_greedy_tokens(family, mode):
    """Trees whose accepted paths skip rows: K/V move through block tables, states come from nodes."""
    model, _ = hybrid_target(family)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    lanes = [(f"lane-{i}", prompt, params) for i, prompt in enumerate(steered_prompts(family))]
    outputs, pool, stepper, _ = serve(runner_for(model, mode, steered(family, mode)), lanes, num_blocks=64)
    for name, prompt, _ in lanes:
        assert outputs[name] == alone(model, prompt, params)
    counters = stepper.counters
    assert 0 < counters.accepted_tokens < counters.draft_tokens
    assert_drained(pool)


@pytest.mark.parametrize("mode", ["none", "mtp"])
@pytest.mark.parametrize("family", FAMILIES)
def test_preempted_lanes_resume_by_recomputation_with_unchanged_output(family, mode, tmp_root):
    model = with_head(family, tmp_root)
    lanes = mixed_lanes(model.config.vocab_size, 6, seed=2)
    # 12 blocks of 16 tokens: two lanes at their longest, so later lanes preempt earlier ones
    outputs, pool, stepper, _ = serve(runner_for(model, mode), lanes, num_blocks=12)
    assert stepper.counters.preemptions > 0
    for name, prompt, params in lanes:
        assert outputs[name] == alone(model, prompt, params)
    assert_drained(pool)


@pytest.mark.parametrize("seeded", [False, True])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_preempted_lane_resumes_from_the_prefill_caches_nearest_state(family, seeded, tmp_root):
    """Preempted mid-decode, a lane gives back its blocks and slot; resumed, it starts from its own
    stored prompt prefix (blocks shared again, the state at that block boundary loaded into a
    slot) and recomputes only the rest: its output is the one it would have had."""
    model = with_head(family, tmp_root)
    decoder = model.decoder
    pool = HybridPool(decoder.config, 32, BLOCK_TOKENS, 2, decoder.dtype, decoder.device)
    cache = PrefixCache(1 << 30, CACHE_BLOCK)
    stepper = ModelStepper(runner_for(model, "none"), cache, pool=pool)
    prompt = list(range(5, 75))  # 70 tokens: a 64-token prefix is stored
    params = SamplingParams(max_tokens=20, temperature=0.9 if seeded else 0.0, seed=7, ignore_eos=True)
    state = stepper.start(LaneStart("lane", prompt, params))
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 16)
    for _ in range(6):
        stepper.decode(state)
    stepper.preempt(state)
    assert pool.allocator.num_used == 4 and pool.states.num_free == 2  # the entry's blocks alone
    stepper.resume(state)
    assert state.prefix_tokens == 2 * CACHE_BLOCK and stepper.counters.prefix_cache_hits == 1
    assert stepper.num_to_prefill(state) == len(prompt) + 6 - 2 * CACHE_BLOCK - 1  # (the last: the next root)
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 16)
    while not state.finished:
        stepper.decode(state)
    assert state.output_ids == alone(model, prompt, params)
    stepper.release(state)
    assert_drained(pool, cache)


def system_prompt_lanes(vocab: int, num: int) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(5)
    system = [rng.randrange(3, vocab) for _ in range(70)]  # two whole cache blocks (four pool blocks) and a bit
    lanes = []
    for index in range(num):
        question = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 20))]
        params = SamplingParams(max_tokens=16, temperature=0.8 if index % 2 else 0.0, seed=index, ignore_eos=True)
        lanes.append((f"lane-{index}", system + question, params))
    return lanes


@pytest.mark.parametrize("mode", ["none", "auto"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lanes_share_a_cached_prefixs_blocks_by_reference(family, mode, tmp_root):
    model = with_head(family, tmp_root)
    lanes = system_prompt_lanes(model.config.vocab_size, 5)
    cold, cold_pool, _, cold_holders = serve(runner_for(model, mode), lanes, num_blocks=64, join_every=3)
    cache = PrefixCache(1 << 30, CACHE_BLOCK)
    # a lane every 3 steps: the first has stored its prefix (after its 3-step prefill) when the next starts
    warm, pool, stepper, holders = serve(runner_for(model, mode), lanes, num_blocks=64, cache=cache, join_every=3)
    assert warm == cold
    for name, prompt, params in lanes:
        assert warm[name] == alone(model, prompt, params)
    assert stepper.counters.prefix_cache_hits == len(lanes) - 1
    assert cache.stats.hit_tokens == 2 * CACHE_BLOCK * (len(lanes) - 1)
    assert cold_holders == 1 and holders >= 3  # the system prompt's first block: lanes and the entry
    (entry,) = [e.target for e in cache._entries.values()]
    assert isinstance(entry, HybridBlocks) and entry.num_tokens == 2 * CACHE_BLOCK
    assert pool.allocator.num_used == len(entry.block_ids)  # only the entry holds blocks now
    assert sorted(entry.states) == [CACHE_BLOCK, 2 * CACHE_BLOCK]  # a state at each of its block boundaries
    assert_drained(pool, cache)
    assert_drained(cold_pool)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_lane_holds_a_state_slot_only_while_it_runs(family, tmp_root):
    model = with_head(family, tmp_root)
    decoder = model.decoder
    pool = HybridPool(decoder.config, 8, BLOCK_TOKENS, 2, decoder.dtype, decoder.device)
    runner = runner_for(model, "none")
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    sequence = runner.start("one", list(range(3, 23)), params, pool=pool)
    cache = sequence.cache
    assert isinstance(cache, PagedHybridCache) and not cache.holds_state_slot
    runner.prefill(sequence, 8)
    assert cache.holds_state_slot and pool.states.num_free == 1
    slot_state = cache.recurrent.delta_states
    assert slot_state.data_ptr() in {pool.states.delta_states[i].data_ptr() for i in range(2)}  # in the pool
    assert torch.count_nonzero(slot_state) > 0
    cache.release()
    assert pool.states.num_free == 2 and pool.allocator.num_used == 0
