"""The prefill cache over the KV pool: a cached prefix's blocks are shared by holder count.

Lanes with a common 70-token system prompt and different questions, through the real scheduler
and stepper on the tiny float64 targets (test_batched_engine's). The oracle: the same lanes
batched without the prefill cache.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from shared.sampling import SamplingParams
from tests.worker.engine.test_batched_engine import alone, run_batched
from tests.worker.speculation.test_lossless import loaded, runner_for
from worker.models.kv_pool import KVPool
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.prefix_cache import PrefixCache
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind

SYSTEM_TOKENS = 70  # two whole 32-token cache blocks and a partial one
BIG_BUDGET = 1 << 40  # so that only the pool's pressure evicts


def shared_prefix_lanes(family: str, num: int, num_systems: int = 1) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(7)
    vocab = loaded(family).config.vocab_size
    systems = [[rng.randrange(3, vocab) for _ in range(SYSTEM_TOKENS)] for _ in range(num_systems)]
    lanes = []
    for index in range(num):
        question = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 20))]
        params = SamplingParams(max_tokens=rng.randint(8, 30), ignore_eos=True)
        lanes.append((f"lane-{index}", systems[index % num_systems] + question, params))
    return lanes


class WatchingStepper(ModelStepper):
    """Records, after every step, the pool's used blocks and how many of the step's lanes start
    with the same block (and that block's holder count)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.peak_used = 0
        self.most_lanes_on_one_block = 0
        self.holders_of_shared_block = 0

    def step(self, items):
        outcomes = super().step(items)
        allocator = self.pool.allocator
        self.peak_used = max(self.peak_used, allocator.num_used)
        tables = [item.state.sequence.cache.block_ids for item in items]
        first_blocks = Counter(table[0] for table in tables if table)
        if first_blocks:
            block, num_lanes = first_blocks.most_common(1)[0]
            if num_lanes > self.most_lanes_on_one_block:
                self.most_lanes_on_one_block = num_lanes
                self.holders_of_shared_block = allocator.holders(block)
        return outcomes


def run(family: str, mode: str, lanes, cache: PrefixCache | None, num_blocks: int = 400):
    def make(runner, pool):
        return WatchingStepper(runner, cache, pool=pool)

    outputs, pool, scheduler, _ = run_batched(runner_for(family, mode), lanes, num_blocks=num_blocks, make_stepper=make)
    return outputs, pool, scheduler.stepper


def assert_no_failures(outputs) -> None:
    failed = {name: out for name, out in outputs.items() if isinstance(out, Exception)}
    assert not failed, f"lanes failed: {failed}"


@pytest.mark.parametrize("mode", ["none", "mtp", "ngram", "suffix"])
def test_a_shared_system_prompt_is_served_from_shared_blocks_with_identical_output(mode):
    family = "qwen3"
    lanes = shared_prefix_lanes(family, num=6)
    cold, _, cold_stepper = run(family, mode, lanes, cache=None)
    warm, pool, stepper = run(family, mode, lanes, cache=PrefixCache(BIG_BUDGET))
    assert stepper.prefix_cache is not None and stepper.counters.prefix_cache_hits >= 4
    assert_no_failures(warm)
    assert warm == cold, f"mode {mode}: sharing the prefix's blocks changed the output"
    assert stepper.most_lanes_on_one_block >= 2, "no two lanes of a step read the same prefix block"
    assert stepper.holders_of_shared_block >= stepper.most_lanes_on_one_block + 1  # the lanes and the cache
    assert stepper.peak_used < cold_stepper.peak_used
    # Every lane is done: only the cache holds blocks (64 tokens = 8 blocks of 8); cleared, none.
    assert pool.allocator.num_used == pool.allocator.num_reclaimable == 64 // pool.block_tokens
    stepper.prefix_cache.clear()
    assert pool.allocator.num_used == 0 and pool.allocator.num_free == pool.num_blocks


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_a_full_pool_evicts_cached_prefixes_and_output_stays_identical(mode):
    family = "llama"
    lanes = shared_prefix_lanes(family, num=12, num_systems=4)
    num_blocks = 40  # 320 tokens: a few lanes, and the cache's entries only while there is room
    cold, _, _ = run(family, mode, lanes, cache=None, num_blocks=num_blocks)
    cache = PrefixCache(BIG_BUDGET)
    warm, pool, stepper = run(family, mode, lanes, cache=cache, num_blocks=num_blocks)
    assert_no_failures(warm)
    assert cache.stats.evictions > 0, "the pool never ran short: the test would prove nothing"
    assert stepper.counters.prefix_cache_hits > 0
    assert warm == cold
    assert pool.allocator.num_used == pool.allocator.num_reclaimable
    cache.clear()
    assert pool.allocator.num_used == 0 and pool.allocator.num_free == pool.num_blocks


def test_a_preempted_lane_lets_go_of_shared_blocks_and_the_cache_keeps_them():
    family = "qwen3"
    lanes = shared_prefix_lanes(family, num=2)
    _, pool, stepper = run(family, "none", lanes[:1], cache=PrefixCache(BIG_BUDGET))
    shared = pool.allocator.num_used  # the cached prefix's blocks
    name, prompt, params = lanes[1]
    state = stepper.start(LaneStart(name, prompt, params))
    assert state.prefix_tokens == 64
    first = state.sequence.cache.block_ids[0]
    assert pool.allocator.holders(first) == 2
    stepper.preempt(state)
    assert pool.allocator.holders(first) == 1 and pool.allocator.num_used == shared
    assert state.sequence.cache.block_ids == [] and state.claimed_blocks == 0
    stepper.resume(state)  # admitted again: the cached prefix serves it once more
    assert state.sequence.cache.block_ids[0] == first and pool.allocator.holders(first) == 2
    assert state.sequence.cache.length == 64 and stepper.counters.prefix_cache_hits == 2


def drain(scheduler: Scheduler, stepper: ModelStepper, lanes) -> dict[str, list[int] | Exception]:
    """Submit `lanes` at once and step until every one is done."""
    for name, prompt, params in lanes:
        blocks, most = stepper.blocks_to_admit(len(prompt)), stepper.max_blocks(len(prompt), params.max_tokens)
        scheduler.submit(LaneRequest((name, 0), 0, None, LaneStart(name, prompt, params), blocks, most))
    outputs: dict[str, list[int] | Exception] = {}
    for _ in range(1000):
        if scheduler.idle:
            return outputs
        for result in scheduler.step():
            if result.kind is StepKind.FAILED:
                outputs[result.key[0]] = result.error
            elif result.kind is StepKind.DECODE and result.state.finished:
                outputs[result.key[0]] = list(result.state.output_ids)
                scheduler.retire(result.key)
    raise AssertionError("the lanes never finished")


def test_a_hit_on_blocks_only_the_cache_held_counts_them_when_the_next_lane_is_admitted():
    # 13 blocks of 8: the cache alone holds 8 (a 64-token prefix), 5 are free. A hits the prefix
    # and takes 2 new blocks; B (no hit) needs 5 for its first chunk. Counted as free when the
    # step was planned, the 8 are A's now: B must wait for A, not start and run out of blocks.
    family = "qwen3"
    runner = runner_for(family, "none")
    decoder = runner.decoder
    pool = KVPool(decoder.config, 13, 8, decoder.dtype, decoder.device)
    stepper = ModelStepper(runner, PrefixCache(BIG_BUDGET), pool=pool)
    scheduler = Scheduler(stepper, SchedulerConfig(8, 1 << 40, 64, pool.num_blocks))
    rng = random.Random(3)
    vocab = loaded(family).config.vocab_size
    system = [rng.randrange(3, vocab) for _ in range(64)]
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    warm = ("warm", system + [rng.randrange(3, vocab) for _ in range(10)], params)
    hit = ("hit", system + [rng.randrange(3, vocab) for _ in range(10)], params)
    other = ("other", [rng.randrange(3, vocab) for _ in range(40)], params)
    drain(scheduler, stepper, [warm])
    assert pool.allocator.num_reclaimable == pool.allocator.num_used == 8
    outputs = drain(scheduler, stepper, [hit, other])
    assert_no_failures(outputs)
    assert stepper.counters.prefix_cache_hits == 1
    for name, prompt, lane_params in (hit, other):
        assert outputs[name] == alone(family, prompt, lane_params)
