"""The scheduler's policy, driven by a fake stepper: no model, no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from worker.scheduler import LaneRequest, LaneTooLarge, Scheduler, SchedulerConfig, StepKind


@dataclass
class FakeLane:
    name: str
    num_prompt: int  # tokens to prefill (0: decode from the first turn)
    num_output: int  # decode steps until finished
    prefilled: int = 0
    decoded: int = 0

    @property
    def finished(self) -> bool:
        return self.decoded >= self.num_output


@dataclass
class FakeStepper:
    log: list[str] = field(default_factory=list)  # "A:prefill:4", "A:decode", "A:start", "A:release"
    fail_on: set[str] = field(default_factory=set)

    def start(self, payload: FakeLane) -> FakeLane:
        self.log.append(f"{payload.name}:start")
        if f"{payload.name}:start" in self.fail_on:
            raise MemoryError("no room")
        return payload

    def num_to_prefill(self, lane: FakeLane) -> int:
        return lane.num_prompt - lane.prefilled

    def prefill(self, lane: FakeLane, max_tokens: int) -> int:
        lane.prefilled += max_tokens
        self.log.append(f"{lane.name}:prefill:{max_tokens}")
        return max_tokens

    def decode(self, lane: FakeLane) -> list[int]:
        if f"{lane.name}:decode" in self.fail_on:
            raise RuntimeError("boom")
        lane.decoded += 1
        self.log.append(f"{lane.name}:decode")
        return [lane.decoded]

    def release(self, lane: FakeLane) -> None:
        self.log.append(f"{lane.name}:release")


def request(lane: FakeLane, kv_bytes: int = 1, deadline: float | None = None) -> LaneRequest:
    return LaneRequest((lane.name, 0), kv_bytes, deadline, lane)


def run(scheduler: Scheduler, max_steps: int = 100) -> list:
    """Step until idle, retiring finished lanes as the owner does; the results in order."""
    results = []
    for _ in range(max_steps):
        result = scheduler.step()
        if result is None:
            break
        results.append(result)
        if result.kind is StepKind.DECODE and result.state.finished:
            scheduler.retire(result.key)
    return results


def steps_of(log: list[str]) -> list[str]:
    return [entry for entry in log if ":prefill" in entry or entry.endswith(":decode")]


def test_lanes_take_turns_one_step_each():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=2, max_kv_bytes=10, max_prefill_chunk=8))
    scheduler.submit(request(FakeLane("A", 0, 3)))
    scheduler.submit(request(FakeLane("B", 0, 3)))
    run(scheduler)
    assert steps_of(stepper.log) == ["A:decode", "B:decode"] * 3


def test_long_prompt_is_prefilled_in_chunks_while_the_other_lane_keeps_decoding():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=2, max_kv_bytes=10, max_prefill_chunk=4))
    scheduler.submit(request(FakeLane("A", 0, 6)))
    scheduler.submit(request(FakeLane("B", 11, 1)))
    run(scheduler)
    assert steps_of(stepper.log)[:7] == [
        "A:decode",
        "B:prefill:4",
        "A:decode",
        "B:prefill:4",
        "A:decode",
        "B:prefill:3",
        "A:decode",
    ]


def test_a_waiting_lane_starts_when_a_lane_is_retired():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=1, max_kv_bytes=10, max_prefill_chunk=8))
    scheduler.submit(request(FakeLane("A", 0, 2)))
    scheduler.submit(request(FakeLane("B", 0, 1)))
    scheduler.step()
    assert (scheduler.num_running, scheduler.num_waiting) == (1, 1)
    run(scheduler)
    assert stepper.log == ["A:start", "A:decode", "A:decode", "A:release", "B:start", "B:decode", "B:release"]


def test_admission_waits_for_kv_bytes_and_keeps_arrival_order():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=4, max_kv_bytes=10, max_prefill_chunk=8))
    scheduler.submit(request(FakeLane("A", 0, 2), kv_bytes=6))
    scheduler.submit(request(FakeLane("B", 0, 1), kv_bytes=6))  # does not fit next to A
    scheduler.submit(request(FakeLane("C", 0, 1), kv_bytes=1))  # would fit, but must not overtake B
    scheduler.step()
    assert scheduler.num_running == 1 and scheduler.kv_bytes == 6
    run(scheduler)
    starts = [entry for entry in stepper.log if entry.endswith(":start")]
    assert starts == ["A:start", "B:start", "C:start"]
    assert stepper.log.index("B:start") > stepper.log.index("A:release")
    assert scheduler.kv_bytes == 0 and scheduler.idle


def test_a_lane_larger_than_the_memory_budget_is_refused():
    scheduler = Scheduler(FakeStepper(), SchedulerConfig(max_lanes=2, max_kv_bytes=10))
    with pytest.raises(LaneTooLarge, match="kv_bytes=11"):
        scheduler.submit(request(FakeLane("A", 0, 1), kv_bytes=11))


def test_cancellation_is_checked_before_every_step():
    cancelled: set[str] = set()
    stepper = FakeStepper()
    scheduler = Scheduler(
        stepper, SchedulerConfig(max_lanes=2, max_kv_bytes=10), is_cancelled=lambda key: key[0] in cancelled
    )
    scheduler.submit(request(FakeLane("A", 0, 100)))
    scheduler.submit(request(FakeLane("B", 0, 100)))
    scheduler.step(), scheduler.step()
    cancelled.add("A")
    result = scheduler.step()
    assert (result.key, result.kind) == (("A", 0), StepKind.CANCELLED)
    assert stepper.log[-1] == "A:release" and scheduler.num_running == 1
    assert scheduler.step().key == ("B", 0)


def test_a_cancelled_waiting_lane_is_dropped_without_starting():
    cancelled = {"B"}
    stepper = FakeStepper()
    scheduler = Scheduler(
        stepper, SchedulerConfig(max_lanes=1, max_kv_bytes=10), is_cancelled=lambda key: key[0] in cancelled
    )
    scheduler.submit(request(FakeLane("A", 0, 5)))
    scheduler.submit(request(FakeLane("B", 0, 5)))
    results = run(scheduler)
    assert [r.kind for r in results if r.key == ("B", 0)] == [StepKind.CANCELLED]
    assert "B:start" not in stepper.log


def test_a_lane_past_its_deadline_is_dropped_before_its_next_step():
    now = [100.0]
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=1, max_kv_bytes=10), clock=lambda: now[0])
    scheduler.submit(request(FakeLane("A", 0, 100), deadline=105.0))
    assert scheduler.step().kind is StepKind.DECODE
    now[0] = 106.0
    result = scheduler.step()
    assert result.kind is StepKind.EXPIRED and scheduler.idle
    assert stepper.log[-1] == "A:release"


def test_a_failing_lane_is_released_and_the_others_go_on():
    stepper = FakeStepper(fail_on={"A:decode", "C:start"})
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=3, max_kv_bytes=10))
    scheduler.submit(request(FakeLane("A", 0, 3)))
    scheduler.submit(request(FakeLane("B", 0, 2)))
    scheduler.submit(request(FakeLane("C", 0, 2)))
    results = run(scheduler)
    failed = {r.key[0]: r.error for r in results if r.kind is StepKind.FAILED}
    assert isinstance(failed["A"], RuntimeError) and isinstance(failed["C"], MemoryError)
    assert [r.key[0] for r in results if r.kind is StepKind.DECODE] == ["B", "B"]
    assert scheduler.idle and scheduler.kv_bytes == 0


def test_retire_of_a_waiting_lane_removes_it():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes=1, max_kv_bytes=10))
    scheduler.submit(request(FakeLane("A", 0, 1)))
    scheduler.submit(request(FakeLane("B", 0, 1)))
    scheduler.retire(("B", 0))
    run(scheduler)
    assert "B:start" not in stepper.log and scheduler.idle
