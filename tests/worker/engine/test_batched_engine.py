"""The batched engine: lanes that share steps emit what each would emit alone.

Tiny random Qwen3 and Llama targets in float64 (test_lossless's), 12 lanes with different
prompt lengths and output lengths joining and leaving mid-run through the real scheduler and
stepper, their K/V in one block pool, a small token budget so prefill chunks share steps with
decode rows. The oracle: the same request run alone in plain decoding (its own KV buffer).
"""

from __future__ import annotations

import random

import pytest

from shared.sampling import SamplingParams
from tests.worker.speculation.test_lossless import FAMILIES, MODES, decode, loaded, make_prompts, new_runner, runner_for
from worker.drafters.ngram import PromptLookupDrafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.decoder import DECODE_BUCKETS
from worker.models.kv_pool import KVPool
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind
from worker.serving.step_cost_probe import measure_step_costs
from worker.speculation.step_costs import StepCosts

NUM_LANES = 12
BLOCK_TOKENS = 8


def lanes_for(family: str, sampled: bool = False, num: int = NUM_LANES) -> list[tuple[str, list[int], SamplingParams]]:
    rng = random.Random(11)
    prompts = make_prompts(loaded(family).config.vocab_size, num, seed=5)
    lanes = []
    for index, prompt in enumerate(prompts):
        max_tokens = rng.randint(6, 40)
        params = (
            SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=1.0, top_p=0.9, seed=100 + index)
            if sampled
            else SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        )
        lanes.append((f"lane-{index}", prompt, params))
    return lanes


def run_batched(
    runner: ModelRunner,
    lanes: list[tuple[str, list[int], SamplingParams]],
    num_blocks: int = 400,
    max_batch_tokens: int = 64,
    max_lanes: int = 8,
    join_every: int = 2,
    make_stepper=lambda runner, pool: ModelStepper(runner, pool=pool),
) -> tuple[dict[str, list[int] | Exception], KVPool, Scheduler, list[int]]:
    """Lanes join one every `join_every` steps; returns each one's output (or error), the pool,
    the scheduler and the number of lanes in each step."""
    decoder = runner.decoder
    pool = KVPool(decoder.config, num_blocks, BLOCK_TOKENS, decoder.dtype, decoder.device)
    stepper = make_stepper(runner, pool)
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes, 1 << 40, max_batch_tokens, pool.num_blocks))
    pending, outputs, lanes_per_step = list(lanes), {}, []
    step = 0
    while pending or not scheduler.idle:
        if pending and step % join_every == 0:
            name, prompt, params = pending.pop(0)
            blocks, most = stepper.blocks_to_admit(len(prompt)), stepper.max_blocks(len(prompt), params.max_tokens)
            scheduler.submit(LaneRequest((name, 0), 0, None, LaneStart(name, prompt, params), blocks, most))
        results = scheduler.step()
        lanes_per_step.append(sum(r.kind in (StepKind.PREFILL, StepKind.DECODE) for r in results))
        for result in results:
            if result.kind is StepKind.FAILED:
                outputs[result.key[0]] = result.error
            elif result.kind is StepKind.DECODE and result.state.finished:
                outputs[result.key[0]] = list(result.state.output_ids)
                scheduler.retire(result.key)
        step += 1
        assert step < 5000, "the batch never drained"
    return outputs, pool, scheduler, lanes_per_step


def alone(family: str, prompt: list[int], params: SamplingParams, mode: str = "none") -> list[int]:
    return decode(runner_for(family, mode), prompt, params, SpecStats())


def assert_as_alone(family: str, lanes, outputs, mode: str = "none") -> None:
    for name, prompt, params in lanes:
        got = outputs[name]
        assert not isinstance(got, Exception), f"{name} failed: {got!r}"
        assert got == alone(family, prompt, params, mode), f"mode {mode}: {name} differs from the request run alone"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_each_lane_of_a_batch_emits_its_greedy_tokens_alone(family, mode):
    lanes = lanes_for(family)
    outputs, pool, _, lanes_per_step = run_batched(runner_for(family, mode), lanes)
    assert max(lanes_per_step) >= 6, "lanes did share steps"
    assert_as_alone(family, lanes, outputs)
    assert pool.allocator.num_used == 0


@pytest.mark.parametrize("mode", ["none", "mtp", "tree"])
def test_decode_steps_padded_to_fixed_buckets_emit_the_same_tokens(mode):
    """With decode buckets (what a CUDA worker runs, for graph capture) a decode step's rows are
    padded up to a fixed count; the padding attends to nothing and changes no lane's tokens."""
    family = "qwen3"
    runner = runner_for(family, mode)
    decoder = runner.decoder
    shapes: list[int] = []
    hook = decoder.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(args[0].shape[0]))
    decoder.decode_buckets = DECODE_BUCKETS
    try:
        lanes = lanes_for(family)
        outputs, pool, _, _ = run_batched(runner, lanes)
    finally:
        decoder.decode_buckets = None
        hook.remove()
    assert_as_alone(family, lanes, outputs)
    assert pool.allocator.num_used == 0
    assert set(shapes) - set(DECODE_BUCKETS), "prefill chunks keep their own shapes"
    assert any(rows in DECODE_BUCKETS and rows not in (1, 2, 4) for rows in shapes), shapes


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_a_seeded_sampled_lane_emits_the_same_tokens_in_a_batch(family, mode):
    lanes = lanes_for(family, sampled=True, num=8)
    outputs, _, _, _ = run_batched(runner_for(family, mode), lanes)
    assert_as_alone(family, lanes, outputs, mode)


@pytest.mark.parametrize("mode", ["none", "mtp", "tree"])
def test_exhausted_blocks_preempt_a_lane_that_resumes_with_identical_output(mode):
    family = "qwen3"
    lanes = lanes_for(family)
    outputs, pool, scheduler, _ = run_batched(runner_for(family, mode), lanes, num_blocks=24, max_lanes=8)
    assert scheduler.num_preemptions > 0, "the pool never ran out: the test would prove nothing"
    assert_as_alone(family, lanes, outputs)
    assert pool.allocator.num_used == 0


def test_after_500_requests_every_block_is_free():
    family = "llama"
    rng = random.Random(3)
    vocab = loaded(family).config.vocab_size
    lanes = [
        (
            f"r{i}",
            [rng.randrange(3, vocab) for _ in range(rng.randint(1, 20))],
            SamplingParams(max_tokens=rng.randint(1, 4)),
        )
        for i in range(500)
    ]
    outputs, pool, _, _ = run_batched(runner_for(family, "ngram"), lanes, num_blocks=40, join_every=1, max_lanes=16)
    assert len(outputs) == 500 and not any(isinstance(o, Exception) for o in outputs.values())
    assert pool.allocator.num_used == 0 and pool.allocator.num_free == pool.num_blocks


class FailingFor(PromptLookupDrafter):
    """n-gram drafting that raises for one request: a lane whose own processing breaks."""

    def __init__(self, bad_request: str, **kwargs):
        super().__init__(**kwargs)
        self.bad_request = bad_request

    def propose(self, state, sequence):
        if sequence.request_id == self.bad_request and len(sequence.output_ids) >= 3:
            raise RuntimeError("broken drafter state")
        return super().propose(state, sequence)


def test_a_lane_that_raises_fails_alone_and_the_others_are_unchanged():
    family = "qwen3"
    model = loaded(family)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, FailingFor("lane-2"))
    lanes = lanes_for(family)
    outputs, pool, _, _ = run_batched(runner, lanes)
    assert isinstance(outputs["lane-2"], RuntimeError)
    assert_as_alone(family, [lane for lane in lanes if lane[0] != "lane-2"], outputs)
    assert pool.allocator.num_used == 0


class CountingStepper(ModelStepper):
    """Records the draft length adaptive speculation chose for every decode step."""

    chosen: list[int]

    def _limit_drafts(self, decoding):
        super()._limit_drafts(decoding)
        if decoding:
            self.chosen.append(decoding[0].sequence.draft_limit)


@pytest.mark.parametrize("mode", ["mtp", "tree", "ngram", "suffix", "auto"])
def test_adaptive_draft_lengths_keep_every_lane_exact(mode):
    family = "llama"
    # its own runner: the stepper prices rows on the drafter (`auto`'s row_price, from timed steps),
    # which a shared runner would carry into other tests (a high price left auto drafting nothing)
    runner = new_runner(family, mode)
    # few lanes: drafting pays; many: it does not (a cost model shaped like a CPU's)
    max_draft = ModelStepper(runner)._decode_rows - 1
    seconds = {
        (lanes, k): 0.01 * lanes * (1 + k * (0.02 if lanes <= 2 else 0.5))
        for lanes in (1, 2, 8)
        for k in (0, 1, max_draft)
    }
    chosen: list[int] = []

    def make(runner_, pool):
        stepper = CountingStepper(runner_, pool=pool)
        stepper.chosen, stepper.step_costs = chosen, StepCosts(seconds)
        return stepper

    lanes = lanes_for(family)
    outputs, pool, _, _ = run_batched(runner, lanes, join_every=6, make_stepper=make)
    assert 0 in chosen and any(k > 0 for k in chosen), f"the load never switched the draft length: {chosen}"
    assert_as_alone(family, lanes, outputs)
    assert pool.allocator.num_used == 0


def test_step_costs_are_measured_for_each_load_and_draft_length():
    runner = runner_for("qwen3", "mtp")
    decoder = runner.decoder
    stepper = ModelStepper(runner, pool=KVPool(decoder.config, 200, BLOCK_TOKENS, decoder.dtype, decoder.device))
    costs = stepper.measure_step_costs(lane_counts=(1, 4), repeats=1)
    assert costs is not None and costs.lane_counts == [1, 4] and costs.draft_lengths[0] == 0
    assert all(seconds > 0 for seconds in costs.seconds.values())
    assert stepper.pool.allocator.num_used == 0, "the measurement gives its blocks back"
    assert ModelStepper(runner_for("qwen3", "none"), pool=stepper.pool).measure_step_costs() is None
    assert costs.complete


def test_the_step_cost_probe_stops_at_its_time_budget():
    runner = runner_for("qwen3", "mtp")
    decoder = runner.decoder
    pool = KVPool(decoder.config, 200, BLOCK_TOKENS, decoder.dtype, decoder.device)
    costs = measure_step_costs(runner, pool, max_draft=3, lane_counts=(1, 4), repeats=2, budget_s=0.0)
    # one round (the warm-up one) at one lane, then the budget is spent: no more rounds, no 4 lanes
    assert costs is not None and costs.lane_counts == [1] and not costs.complete
    assert costs.draft_lengths == [0, 1, 3] and all(seconds > 0 for seconds in costs.seconds.values())
    assert pool.allocator.num_used == 0
