"""The batch scheduler's policy, driven by a fake stepper with a fake block pool: no model, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from worker.serving.scheduler import LaneRequest, LaneTooLarge, Scheduler, SchedulerConfig, StepKind


@dataclass
class FakeLane:
    name: str
    num_prompt: int  # tokens to prefill (0: decode from the first step)
    num_output: int  # decode steps until finished
    prefilled: int = 0
    decoded: int = 0
    blocks: int = 0  # pool blocks held

    @property
    def finished(self) -> bool:
        return self.decoded >= self.num_output

    @property
    def num_tokens(self) -> int:
        return self.prefilled + self.decoded


@dataclass
class FakeStepper:
    """Tokens take blocks of `block_tokens`; a decode step takes `decode_rows` rows."""

    num_blocks: int = 1000
    block_tokens: int = 4
    rows_per_decode: int = 1
    log: list[str] = field(default_factory=list)  # one entry per step: "A:p4 B:d" (p: prefill chunk, d: decode)
    events: list[str] = field(default_factory=list)  # "A:start", "A:release", "A:preempt", "A:resume"
    fail_on: set[str] = field(default_factory=set)
    used: int = 0

    def start(self, payload: FakeLane) -> FakeLane:
        self.events.append(f"{payload.name}:start")
        if f"{payload.name}:start" in self.fail_on:
            raise MemoryError("no room")
        return payload

    def num_to_prefill(self, lane: FakeLane) -> int:
        return lane.num_prompt - lane.prefilled

    def decode_rows(self, lane: FakeLane) -> int:
        return self.rows_per_decode

    def free_blocks(self) -> int:
        return self.num_blocks - self.used

    def blocks_needed(self, lane: FakeLane, num_rows: int) -> int:
        return max(-(-(lane.num_tokens + num_rows) // self.block_tokens) - lane.blocks, 0)

    def step(self, items) -> list:
        entries, outcomes = [], []
        for item in items:
            lane = item.state
            needed = self.blocks_needed(lane, item.num_prefill or self.rows_per_decode)
            assert needed <= self.free_blocks(), "the scheduler planned more blocks than are free"
            lane.blocks += needed
            self.used += needed
            if item.num_prefill:
                lane.prefilled += item.num_prefill
                entries.append(f"{lane.name}:p{item.num_prefill}")
                outcomes.append([])
            elif f"{lane.name}:decode" in self.fail_on:
                entries.append(f"{lane.name}:d")
                outcomes.append(RuntimeError("boom"))
            else:
                lane.decoded += 1
                entries.append(f"{lane.name}:d")
                outcomes.append([lane.decoded])
        self.log.append(" ".join(entries))
        return outcomes

    def preempt(self, lane: FakeLane) -> None:
        self.events.append(f"{lane.name}:preempt")
        self.used -= lane.blocks
        lane.blocks = 0
        lane.num_prompt += lane.decoded  # resumes by prefilling prompt + output
        lane.prefilled = 0
        lane.num_output -= lane.decoded
        lane.decoded = 0

    def resume(self, lane: FakeLane) -> None:
        self.events.append(f"{lane.name}:resume")

    def release(self, lane: FakeLane) -> None:
        self.events.append(f"{lane.name}:release")
        self.used -= lane.blocks
        lane.blocks = 0


def request(lane: FakeLane, kv_bytes: int = 0, deadline: float | None = None, num_blocks: int = 0) -> LaneRequest:
    return LaneRequest((lane.name, 0), kv_bytes, deadline, lane, num_blocks=num_blocks, max_blocks=num_blocks)


def run(scheduler: Scheduler, max_steps: int = 100) -> list:
    """Step until idle, retiring finished lanes as the owner does; the results in order."""
    results = []
    for _ in range(max_steps):
        if scheduler.idle:
            break
        for result in scheduler.step():
            results.append(result)
            if result.kind is StepKind.DECODE and result.state.finished:
                scheduler.retire(result.key)
    return results


def config(**overrides) -> SchedulerConfig:
    fields = dict(max_lanes=4, max_kv_bytes=10, max_batch_tokens=8, num_blocks=1000)
    fields.update(overrides)
    return SchedulerConfig(**fields)


def test_every_decoding_lane_runs_in_every_step():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config())
    for name in "ABC":
        scheduler.submit(request(FakeLane(name, 0, 3)))
    run(scheduler)
    assert stepper.log == ["A:d B:d C:d"] * 3


def test_a_long_prompt_is_chunked_by_the_budget_while_the_others_keep_decoding():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_batch_tokens=8))
    scheduler.submit(request(FakeLane("A", 0, 5)))
    scheduler.submit(request(FakeLane("B", 17, 2)))
    run(scheduler)
    assert stepper.log[:5] == ["A:d B:p7", "A:d B:p7", "A:d B:p3", "A:d B:d", "A:d B:d"]


def test_a_new_lane_brings_its_first_chunk_into_the_running_lanes_step():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config())
    scheduler.submit(request(FakeLane("A", 0, 3)))
    scheduler.step()
    scheduler.submit(request(FakeLane("B", 5, 1)))
    scheduler.step()
    assert stepper.log == ["A:d", "A:d B:p5"]


def test_decode_rows_past_the_budget_take_turns_across_steps():
    stepper = FakeStepper(rows_per_decode=3)
    scheduler = Scheduler(stepper, config(max_batch_tokens=7))  # room for two lanes' decode rows a step
    for name in "ABC":
        scheduler.submit(request(FakeLane(name, 0, 2)))
    run(scheduler)
    first_two = [entry.split() for entry in stepper.log[:3]]
    assert all(len(step) == 2 for step in first_two), stepper.log
    counts = {name: sum(f"{name}:d" in step for step in first_two) for name in "ABC"}
    assert counts == {"A": 2, "B": 2, "C": 2}, stepper.log  # nobody starves


def test_a_waiting_lane_starts_when_a_lane_is_retired():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1))
    scheduler.submit(request(FakeLane("A", 0, 2)))
    scheduler.submit(request(FakeLane("B", 0, 1)))
    scheduler.step()
    assert (scheduler.num_running, scheduler.num_waiting) == (1, 1)
    run(scheduler)
    assert stepper.events == ["A:start", "A:release", "B:start", "B:release"]
    assert stepper.log == ["A:d", "A:d", "B:d"]


def test_admission_waits_for_free_blocks_and_keeps_arrival_order():
    stepper = FakeStepper(num_blocks=10)
    scheduler = Scheduler(stepper, config())
    scheduler.submit(request(FakeLane("A", 20, 2), num_blocks=6))
    scheduler.submit(request(FakeLane("B", 20, 1), num_blocks=6))  # does not fit next to A
    scheduler.submit(request(FakeLane("C", 0, 1), num_blocks=1))  # would fit, but must not overtake B
    scheduler.step()
    assert scheduler.num_running == 1
    run(scheduler)
    starts = [entry for entry in stepper.events if entry.endswith(":start")]
    assert starts == ["A:start", "B:start", "C:start"]
    assert stepper.events.index("B:start") > stepper.events.index("A:release")
    assert stepper.used == 0 and scheduler.idle


def test_fixed_memory_lanes_wait_for_kv_bytes():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_kv_bytes=10))
    scheduler.submit(request(FakeLane("A", 0, 2), kv_bytes=6))
    scheduler.submit(request(FakeLane("B", 0, 1), kv_bytes=6))
    scheduler.step()
    assert scheduler.num_running == 1 and scheduler.kv_bytes == 6
    run(scheduler)
    assert scheduler.kv_bytes == 0


def test_when_blocks_run_out_the_newest_lane_is_preempted_and_resumes_with_its_output():
    stepper = FakeStepper(num_blocks=6, block_tokens=4)
    scheduler = Scheduler(stepper, config(max_batch_tokens=16))
    a, b = FakeLane("A", 4, 12), FakeLane("B", 4, 12)
    scheduler.submit(request(a, num_blocks=2))
    scheduler.submit(request(b, num_blocks=2))
    results = run(scheduler)
    assert "B:preempt" in stepper.events and "A:preempt" not in stepper.events
    resumed = stepper.events.index("B:resume")  # admitted again: the stepper may look its prefix up
    assert stepper.events.index("B:preempt") < resumed and stepper.events.count("B:start") == 1
    decoded = {
        name: [t for r in results if r.key[0] == name and r.kind is StepKind.DECODE for t in r.token_ids]
        for name in "AB"
    }
    assert len(decoded["A"]) == 12 and scheduler.num_preemptions >= 1
    assert stepper.used == 0 and scheduler.idle


def test_a_lane_larger_than_the_memory_is_refused():
    scheduler = Scheduler(FakeStepper(), config(max_kv_bytes=10, num_blocks=8))
    with pytest.raises(LaneTooLarge, match="kv_bytes=11"):
        scheduler.submit(request(FakeLane("A", 0, 1), kv_bytes=11))
    with pytest.raises(LaneTooLarge, match="9 KV blocks"):
        scheduler.submit(request(FakeLane("B", 0, 1), num_blocks=9))


def test_cancellation_is_checked_before_every_step():
    cancelled: set[str] = set()
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(), is_cancelled=lambda key: key[0] in cancelled)
    scheduler.submit(request(FakeLane("A", 0, 100)))
    scheduler.submit(request(FakeLane("B", 0, 100)))
    scheduler.step(), scheduler.step()
    cancelled.add("A")
    results = scheduler.step()
    assert [(r.key, r.kind) for r in results] == [(("A", 0), StepKind.CANCELLED), (("B", 0), StepKind.DECODE)]
    assert stepper.events[-1] == "A:release" and scheduler.num_running == 1


def test_a_cancelled_waiting_lane_is_dropped_without_starting():
    cancelled = {"B"}
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1), is_cancelled=lambda key: key[0] in cancelled)
    scheduler.submit(request(FakeLane("A", 0, 5)))
    scheduler.submit(request(FakeLane("B", 0, 5)))
    results = run(scheduler)
    assert [r.kind for r in results if r.key == ("B", 0)] == [StepKind.CANCELLED]
    assert "B:start" not in stepper.events


def test_a_lane_past_its_deadline_is_dropped_before_its_next_step():
    now = [100.0]
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1), clock=lambda: now[0])
    scheduler.submit(request(FakeLane("A", 0, 100), deadline=105.0))
    assert [r.kind for r in scheduler.step()] == [StepKind.DECODE]
    now[0] = 106.0
    assert [r.kind for r in scheduler.step()] == [StepKind.EXPIRED] and scheduler.idle
    assert stepper.events[-1] == "A:release"


def test_a_failing_lane_is_released_and_the_others_go_on():
    stepper = FakeStepper(fail_on={"A:decode", "C:start"})
    scheduler = Scheduler(stepper, config(max_lanes=3))
    scheduler.submit(request(FakeLane("A", 0, 3)))
    scheduler.submit(request(FakeLane("B", 0, 2)))
    scheduler.submit(request(FakeLane("C", 0, 2)))
    results = run(scheduler)
    failed = {r.key[0]: r.error for r in results if r.kind is StepKind.FAILED}
    assert isinstance(failed["A"], RuntimeError) and isinstance(failed["C"], MemoryError)
    assert [r.key[0] for r in results if r.kind is StepKind.DECODE] == ["B", "B"]
    assert scheduler.idle and stepper.used == 0


def test_retire_of_a_waiting_lane_removes_it():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1))
    scheduler.submit(request(FakeLane("A", 0, 1)))
    scheduler.submit(request(FakeLane("B", 0, 1)))
    scheduler.retire(("B", 0))
    run(scheduler)
    assert "B:start" not in stepper.events and scheduler.idle
