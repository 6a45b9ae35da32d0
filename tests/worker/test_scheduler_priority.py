"""Priority classes in the batch scheduler: order of waiting lanes, and preemption of the lowest
class first (fake stepper from the policy tests: no model, no torch)."""

from __future__ import annotations

from tests.worker.test_scheduler import FakeLane, FakeStepper, config, run
from worker.serving.scheduler import LaneRequest, Scheduler, StepKind


def request(lane: FakeLane, priority: int, num_blocks: int = 0) -> LaneRequest:
    return LaneRequest((lane.name, 0), 0, None, lane, num_blocks=num_blocks, max_blocks=num_blocks, priority=priority)


def decoded_by(results: list, name: str) -> list[int]:
    return [t for r in results if r.key[0] == name and r.kind is StepKind.DECODE for t in r.token_ids]


def test_a_waiting_better_class_starts_before_earlier_arrivals():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1))
    scheduler.submit(request(FakeLane("A", 0, 2), priority=0))
    scheduler.step()  # A runs; B (10) then C (0) wait
    scheduler.submit(request(FakeLane("B", 0, 1), priority=10))
    scheduler.submit(request(FakeLane("C", 0, 1), priority=0))
    run(scheduler)
    starts = [event for event in stepper.events if event.endswith(":start")]
    assert starts == ["A:start", "C:start", "B:start"]


def test_a_better_class_preempts_the_lowest_class_when_lanes_are_full():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=2))
    scheduler.submit(request(FakeLane("A", 0, 4), priority=10))
    scheduler.submit(request(FakeLane("B", 0, 4), priority=5))
    scheduler.step()
    scheduler.submit(request(FakeLane("C", 0, 2), priority=0))
    results = scheduler.step()
    assert stepper.log[-1] == "B:d C:d"  # C started in the very next step, A (class 10) made room
    assert "A:preempt" in stepper.events and "B:preempt" not in stepper.events
    assert scheduler.preemptions_by_class == {10: 1}
    results += run(scheduler)
    # nothing lost or repeated: each lane's decode steps count 1..n once (the fake emits its count)
    assert decoded_by(results, "C") == [1, 2]
    assert decoded_by(results, "B") == [2, 3, 4]
    assert decoded_by(results, "A") == [1, 2, 3]  # after its resume the fake counts again from 1


def test_the_most_recent_lane_of_the_lowest_class_is_preempted_first():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=3))
    for name, priority in (("A", 10), ("B", 10), ("C", 3)):
        scheduler.submit(request(FakeLane(name, 0, 5), priority))
    scheduler.step()
    scheduler.submit(request(FakeLane("D", 0, 1), priority=0))
    scheduler.step()
    assert [e for e in stepper.events if e.endswith(":preempt")] == ["B:preempt"]
    # the preempted lane waits at the head of its class, ahead of a later lane of the same class
    scheduler.submit(request(FakeLane("E", 0, 1), priority=10))
    run(scheduler)
    resumed_or_started = [e for e in stepper.events if e.startswith(("B:resume", "E:start"))]
    assert resumed_or_started == ["B:resume", "E:start"]


def test_equal_or_worse_classes_wait_without_preempting():
    stepper = FakeStepper()
    scheduler = Scheduler(stepper, config(max_lanes=1))
    scheduler.submit(request(FakeLane("A", 0, 3), priority=0))
    scheduler.step()
    scheduler.submit(request(FakeLane("B", 0, 1), priority=0))
    scheduler.submit(request(FakeLane("C", 0, 1), priority=7))
    run(scheduler)
    assert scheduler.num_preemptions == 0


def test_a_better_class_short_of_blocks_preempts_the_lowest_class_for_them():
    stepper = FakeStepper(num_blocks=4, block_tokens=4)
    scheduler = Scheduler(stepper, config(max_lanes=4, num_blocks=4, max_batch_tokens=32))
    scheduler.submit(request(FakeLane("A", 8, 2), priority=10, num_blocks=2))
    scheduler.submit(request(FakeLane("B", 8, 2), priority=1, num_blocks=2))
    scheduler.step()  # A and B hold every block
    assert stepper.free_blocks() == 0
    scheduler.submit(request(FakeLane("C", 8, 1), priority=0, num_blocks=2))
    scheduler.step()
    # A (class 10) goes first; B (class 1), still worse than C, too, as B's next block leaves C short
    assert [e for e in stepper.events if e.endswith(":preempt")] == ["A:preempt", "B:preempt"]
    assert stepper.log[-1].startswith("C:p8")  # C first in the step right after it arrived
    results = run(scheduler)
    assert decoded_by(results, "C") == [1] and decoded_by(results, "B") and decoded_by(results, "A")


def test_no_preemption_while_blocks_suffice_for_the_better_class():
    stepper = FakeStepper(num_blocks=8, block_tokens=4)
    scheduler = Scheduler(stepper, config(max_lanes=4, num_blocks=8, max_batch_tokens=32))
    scheduler.submit(request(FakeLane("A", 8, 2), priority=10, num_blocks=2))
    scheduler.step()
    scheduler.submit(request(FakeLane("C", 8, 1), priority=0, num_blocks=2))
    run(scheduler)
    assert scheduler.num_preemptions == 0
