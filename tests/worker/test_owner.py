"""The owner thread's events, on scripted token streams (a fake model): what reaches the wire and when."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

import pytest

from shared.protocol import DeltaEvent, FinalEvent, JobState
from shared.sampling import SamplingParams
from tests.support.tiny_models import train_tokenizer
from worker.engine.stats import SpecStats
from worker.redis_side.jobs import FORCED_CLOSE
from worker.serving.handoff import JobDone, JobRef, JobSpec, Publication, WorkerCounters
from worker.serving.lane_output import OutputOptions, ReasoningOptions
from worker.serving.model_stepper import LaneStart
from worker.serving.owner import Capacity, DropJob, Owner, OwnerConfig, StartJob, StopOwner
from worker.serving.step_delta import StepDelta

TOKENIZER = train_tokenizer()


def ids_of(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False).ids


@dataclass
class ScriptedLane:
    script: list[int]
    params: SamplingParams
    output_ids: list[int]
    num_logprobs: int | None = None
    tokens_per_step: int = 1
    finish_reason: str | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    logprobs: list = field(default_factory=list)
    prefix_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class ScriptedStepper:
    """Emits a fixed token script, `tokens_per_step` at a time, as a speculating model would."""

    script: list[int]
    tokens_per_step: int = 1
    step_delay_s: float = 0.0
    counters: WorkerCounters = field(default_factory=WorkerCounters)
    lanes: list[ScriptedLane] = field(default_factory=list)  # every lane started, in order

    num_blocks = None  # no KV pool: lanes are admitted by lanes free alone

    def kv_bytes(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return 1

    def blocks_to_admit(self, num_tokens: int) -> int:
        return 0

    def max_blocks(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return 0

    def decode_rows(self, lane: ScriptedLane) -> int:
        return lane.tokens_per_step

    def free_blocks(self) -> int:
        return 1 << 62

    def blocks_needed(self, lane: ScriptedLane, num_rows: int) -> int:
        return 0

    def preempt(self, lane: ScriptedLane) -> None:
        raise AssertionError("lanes hold no blocks: nothing is preempted")

    def resume(self, lane: ScriptedLane) -> None:
        raise AssertionError("lanes hold no blocks: nothing is preempted")

    def step(self, items) -> list:
        time.sleep(self.step_delay_s)  # one forward for every lane of the step
        return [self._decode(item.state) for item in items]

    def start(self, payload: LaneStart) -> ScriptedLane:
        lane = ScriptedLane(
            self.script, payload.params, list(payload.resumed_ids), payload.num_logprobs, self.tokens_per_step
        )
        self.lanes.append(lane)
        return lane

    def num_to_prefill(self, lane: ScriptedLane) -> int:
        return 0

    def prefill(self, lane: ScriptedLane, max_tokens: int) -> int:
        raise AssertionError("nothing to prefill")

    def _decode(self, lane: ScriptedLane) -> list[int]:
        done = len(lane.output_ids)
        emitted = lane.script[done : done + lane.tokens_per_step][: lane.params.max_tokens - done]
        lane.output_ids.extend(emitted)
        if len(lane.output_ids) >= lane.params.max_tokens:
            lane.finish_reason = "length"
        elif len(lane.output_ids) >= len(lane.script):
            lane.finish_reason = "stop"
        return emitted

    def release(self, lane: ScriptedLane) -> None:
        pass

    def force_tokens(self, lane: ScriptedLane, token_ids: list[int]) -> list[int]:
        forced = token_ids[: lane.params.max_tokens - len(lane.output_ids)]
        lane.output_ids.extend(forced)
        if len(lane.output_ids) >= lane.params.max_tokens:
            lane.finish_reason = "length"
        return forced

    def stop(self, lane: ScriptedLane) -> None:
        lane.finish_reason = "stop"


class OwnerHarness:
    def __init__(self, stepper: ScriptedStepper, max_lanes: int = 4):
        self.items: list[Publication | JobDone] = []
        self.sink_due = True
        self.done = threading.Event()
        self.capacity = Capacity(max_lanes)
        self.owner = Owner(stepper, TOKENIZER, OwnerConfig("w", "none", max_lanes, 100, 64), self.capacity, self)
        self.thread = threading.Thread(target=self.owner.run)

    def put(self, item) -> bool:  # the owner's sink
        self.items.append(item)
        if isinstance(item, JobDone):
            self.done.set()
        return False  # never merged: every event as the owner made it

    def due(self) -> bool:
        return self.sink_due  # True: every step goes out as it is made, nothing is held

    def pump(self, wait_s: float) -> bool:
        return False  # nothing is ever in flight

    def __enter__(self) -> OwnerHarness:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.owner.inbox.put(StopOwner())
        self.thread.join(10)

    def start(self, spec: JobSpec) -> None:
        self.capacity.hold(spec.n)
        self.owner.inbox.put(StartJob(spec, JobRef(spec.request_id, "stream", "1-0", spec.resume.attempt)))

    def events(self) -> list:
        """The events as they go on the wire (a delta is encoded when its batch goes out)."""
        return [
            item.event.event() if isinstance(item.event, StepDelta) else item.event
            for item in self.items
            if isinstance(item, Publication)
        ]


def spec(
    output: OutputOptions | None = None, max_tokens: int = 100, n: int = 1, resume: JobState | None = None
) -> JobSpec:
    resume = resume or JobState(worker="w", attempt=1, emitted_token_ids=[])
    return JobSpec(
        "req-1",
        "1-0",
        resume.attempt,
        "chat",
        time.time(),
        time.time() + 60,
        ids_of("Hi"),
        SamplingParams(max_tokens=max_tokens),
        n,
        output or OutputOptions(),
        resume,
    )


def run_job(stepper: ScriptedStepper, job: JobSpec) -> list:
    with OwnerHarness(stepper) as harness:
        harness.start(job)
        assert harness.done.wait(10)
    return harness.events()


def test_every_step_is_one_delta_and_each_choice_ends_with_a_final():
    script = ids_of("Hello there, world")
    events = run_job(ScriptedStepper(script, tokens_per_step=2), spec(n=2))
    assert [e.seq for e in events] == list(range(len(events)))
    for choice in (0, 1):
        deltas = [e for e in events if isinstance(e, DeltaEvent) and e.choice == choice]
        assert [len(d.token_ids) for d in deltas] == [2] * (len(script) // 2) + [1] * (len(script) % 2)
        assert "".join(d.text for d in deltas) == "Hello there, world"
        [final] = [e for e in events if isinstance(e, FinalEvent) and e.choice == choice]
        assert final.finish_reason == "stop" and final.usage.completion_tokens == len(script)


def test_deltas_up_to_the_first_visible_output_are_flagged_first_output():
    # The tool-call parser holds "<tool_call>" back until it knows what follows: the first deltas
    # carry token ids but nothing visible, and none of them may be held back by the publisher.
    text = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call> and then some text'
    with OwnerHarness(ScriptedStepper(ids_of(text))) as harness:
        harness.start(spec(OutputOptions(parse_tool_calls=True)))
        assert harness.done.wait(10)
    deltas = [item for item in harness.items if isinstance(item, Publication) and isinstance(item.event, StepDelta)]
    shown = next(i for i, item in enumerate(deltas) if item.event.text or item.event.tool_calls)
    assert shown > 0, "the script should start with deltas that show nothing"
    assert [item.first_output for item in deltas] == [True] * (shown + 1) + [False] * (len(deltas) - shown - 1)
    finals = [item for item in harness.items if isinstance(item, Publication) and isinstance(item.event, FinalEvent)]
    assert finals and not any(item.first_output for item in finals), "finals are urgent by kind, not by flag"


def test_tool_call_streamed_in_many_small_deltas_ends_with_finish_reason_tool_calls():
    text = '<tool_call>\n{"name": "lookup", "arguments": {"q": "foxes", "n": 3}}\n</tool_call>'
    events = run_job(ScriptedStepper(ids_of(text)), spec(OutputOptions(parse_tool_calls=True)))
    calls = [call for e in events if isinstance(e, DeltaEvent) for call in e.tool_calls]
    assert calls[0].function.name == "lookup" and calls[0].id and calls[0].type == "function"
    assert len(calls) > 2
    assert json.loads("".join(call.function.arguments or "" for call in calls)) == {"q": "foxes", "n": 3}
    assert "".join(e.text for e in events if isinstance(e, DeltaEvent)) == ""
    assert events[-1].finish_reason == "tool_calls"


TWO_CALLS = (
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "b", "arguments": {}}</tool_call> and text'
)
SINGLE_CALL = OutputOptions(parse_tool_calls=True, single_tool_call=True)


def test_a_single_call_lane_ends_its_sequence_when_the_call_closes():
    script = ids_of(TWO_CALLS)
    events = run_job(ScriptedStepper(script), spec(SINGLE_CALL))
    calls = [call for e in events if isinstance(e, DeltaEvent) for call in e.tool_calls]
    assert {call.index for call in calls} == {0} and calls[0].function.name == "a"
    assert "".join(e.text for e in events if isinstance(e, DeltaEvent)) == ""
    assert events[-1].finish_reason == "tool_calls"
    assert events[-1].usage.completion_tokens < len(script), "the model went on to a second call"


def test_a_resumed_single_call_lane_whose_call_was_already_published_ends_with_tool_calls():
    script = ids_of(TWO_CALLS)
    first_call = ids_of(TWO_CALLS.split("\n")[0])
    resume = JobState(worker="dead", attempt=2, emitted_token_ids=[first_call], next_seq=5)
    events = run_job(ScriptedStepper(script), spec(SINGLE_CALL, resume=resume))
    assert [(e.type, e.seq, e.finish_reason) for e in events] == [("final", 5, "tool_calls")]


def test_reasoning_budget_forces_the_close_tag_into_the_sequence():
    close_ids = ids_of(FORCED_CLOSE)
    reasoning = ReasoningOptions(starts_in_reasoning=True, budget=4, close_ids=tuple(close_ids))
    script = ids_of("one two three four five six seven eight")
    stepper = ScriptedStepper(script)
    max_tokens = 4 + len(close_ids) + 3
    events = run_job(stepper, spec(OutputOptions(reasoning=reasoning), max_tokens=max_tokens))
    deltas = [e for e in events if isinstance(e, DeltaEvent)]
    token_ids = [t for d in deltas for t in d.token_ids]
    assert token_ids[4 : 4 + len(close_ids)] == close_ids, "forced right after the fourth reasoning token"
    assert "".join(d.reasoning for d in deltas) == TOKENIZER.decode(script[:4])
    content = "".join(d.text for d in deltas)
    assert content.startswith("\n\n") and "</think>" not in content
    assert events[-1].usage.completion_tokens == max_tokens and events[-1].finish_reason == "length"


def test_a_resumed_job_continues_at_the_next_seq_without_repeating_text():
    script = ids_of("The quick brown fox jumps over the lazy dog.")
    whole = "".join(e.text for e in run_job(ScriptedStepper(script), spec()) if isinstance(e, DeltaEvent))
    cut = 5
    published = TOKENIZER.decode(script[:cut])
    resume = JobState(worker="dead", attempt=2, emitted_token_ids=[script[:cut]], next_seq=7)
    events = run_job(ScriptedStepper(script), spec(resume=resume))
    assert events[0].seq == 7 and all(e.attempt == 2 for e in events)
    assert published + "".join(e.text for e in events if isinstance(e, DeltaEvent)) == whole
    assert events[-1].usage.completion_tokens == len(script)


def test_finished_choices_of_a_resumed_job_are_not_run_again():
    script = ids_of("abc def")
    resume = JobState(
        worker="dead", attempt=2, emitted_token_ids=[script, script[:2]], finished_choices=[0], next_seq=9
    )
    events = run_job(ScriptedStepper(script), spec(n=2, resume=resume))
    assert {e.choice for e in events} == {1}
    assert [e.type for e in events if e.type == "final"] == ["final"]


@pytest.mark.parametrize("cancelled", [True, False])
def test_a_dropped_job_stops_before_its_next_step(cancelled):
    stepper = ScriptedStepper(ids_of("x " * 200), step_delay_s=0.01)
    with OwnerHarness(stepper) as harness:
        harness.start(spec())
        while len(harness.events()) < 3:
            time.sleep(0.005)
        harness.owner.inbox.put(DropJob("req-1", cancelled=cancelled))
        deadline = time.time() + 5
        while harness.capacity.held and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(0.05)
    events = harness.events()
    assert harness.capacity.held == 0
    assert len(events) < 20
    if cancelled:
        assert events[-1].type == "final" and events[-1].finish_reason == "cancelled"
        assert isinstance(harness.items[-1], JobDone)
    else:
        assert all(e.type == "delta" for e in events) and not any(isinstance(i, JobDone) for i in harness.items)


def test_a_lane_that_can_never_fit_fails_the_request():
    stepper = ScriptedStepper(ids_of("abc"))
    stepper.kv_bytes = lambda num_prompt, max_tokens: 10_000  # type: ignore[method-assign]
    events = run_job(stepper, spec())
    assert [e.type for e in events] == ["error"] and events[0].code == "context_length_exceeded"


def test_a_resumed_choice_whose_stop_string_was_already_published_just_ends():
    script = ids_of("yes STOP and more")
    resume = JobState(worker="dead", attempt=2, emitted_token_ids=[script[:-2]], next_seq=4)
    job = spec(OutputOptions(stop=("STOP",)), resume=resume)
    events = run_job(ScriptedStepper(script), job)
    assert [(e.type, e.seq) for e in events] == [("final", 4)]
    assert events[0].finish_reason == "stop" and events[0].usage.completion_tokens == len(script) - 2


def held_run(job: JobSpec, script: list[int], drop_after: int | None = None) -> OwnerHarness:
    """A sink that is never due: what the owner may hold, it holds until the lane ends or drops."""
    stepper = ScriptedStepper(script, step_delay_s=0.002 if drop_after else 0.0)
    with OwnerHarness(stepper) as harness:
        harness.sink_due = False
        harness.start(job)
        if drop_after is not None:
            deadline = time.monotonic() + 10
            while (
                time.monotonic() < deadline and len(stepper.lanes[0].output_ids if stepper.lanes else []) < drop_after
            ):
                time.sleep(0.001)
            harness.owner.inbox.put(DropJob("req-1", cancelled=True))
        assert harness.done.wait(10)
    return harness


def test_a_plain_lane_is_held_after_its_first_output_until_the_sink_is_due():
    """Its steps need nothing from their text, so the text is made once per batch, not per step
    (the detokenizer's and the parsers' work between two model steps slows the next step)."""
    text = "The quick brown fox jumps over the lazy dog."
    script = ids_of(text)
    events = held_run(spec(), script).events()
    deltas = [e for e in events if isinstance(e, DeltaEvent)]
    first_shown = next(i for i, d in enumerate(deltas) if d.text)
    assert len(deltas) == first_shown + 2, "up to the first output one a step, then all of it at the end"
    assert [t for d in deltas for t in d.token_ids] == script and "".join(d.text for d in deltas) == text
    assert [e.seq for e in events] == list(range(len(events)))
    assert events[-1].type == "final" and events[-1].usage.completion_tokens == len(script)


@pytest.mark.parametrize(
    "output",
    [
        OutputOptions(stop=("lazy cat",)),
        OutputOptions(reasoning=ReasoningOptions(budget=100, close_ids=(1,))),
        SINGLE_CALL,
    ],
    ids=["stop strings", "reasoning budget", "one tool call"],
)
def test_lanes_that_decide_on_their_text_are_never_held(output):
    script = ids_of("The quick brown fox jumps over the lazy dog.")
    events = held_run(spec(output), script).events()
    assert [len(e.token_ids) for e in events if isinstance(e, DeltaEvent)] == [1] * len(script)


def test_a_cancel_publishes_the_held_tokens_before_the_cancelled_final():
    script = ids_of("x " * 200)
    harness = held_run(spec(max_tokens=len(script)), script, drop_after=20)
    events = harness.events()
    emitted = [t for e in events if isinstance(e, DeltaEvent) for t in e.token_ids]
    assert len(emitted) >= 20 and emitted == script[: len(emitted)]
    assert events[-1].finish_reason == "cancelled" and events[-1].usage.completion_tokens == len(emitted)
