"""The owner's outbox: in order, nothing lost or repeated, deltas merged only while they wait."""

from __future__ import annotations

import threading
import time

from shared.protocol import FinalEvent, Usage
from tests.worker.test_owner import TOKENIZER, ScriptedStepper, ids_of, spec
from worker.redis_side.outbox import Outbox
from worker.serving.handoff import JobDone, JobRef, Publication, WorkerCounters
from worker.serving.owner import Capacity, Owner, OwnerConfig, StartJob, StopOwner
from worker.serving.step_delta import StepDelta

REF = JobRef("req-1", "stream", "1-0", 1)
OTHER = JobRef("req-2", "stream", "2-0", 1)


def publication(
    ref: JobRef, seq: int, text: str, token_ids: list[int], choice: int = 0, first_output: bool = False
) -> Publication:
    event = StepDelta(id=ref.request_id, attempt=1, seq=seq, choice=choice, text=text, token_ids=token_ids)
    return Publication(ref, event, first_output)


def final(ref: JobRef, seq: int) -> Publication:
    event = FinalEvent(
        id=ref.request_id, attempt=1, seq=seq, finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)
    )
    return Publication(ref, event)


def test_a_delta_joins_its_jobs_last_pending_delta_even_behind_other_jobs() -> None:
    outbox = Outbox()
    assert not outbox.put(publication(REF, 0, "Hel", [1]))
    assert not outbox.put(publication(OTHER, 0, "x", [9]))
    assert outbox.put(publication(REF, 1, "lo", [2]))

    first, other = outbox.take()

    assert (first.event.seq, first.event.text, first.event.token_ids) == (0, "Hello", [1, 2])
    assert other.event.text == "x"


def test_nothing_merges_across_a_final_another_choice_or_a_taken_batch() -> None:
    outbox = Outbox()
    outbox.put(publication(REF, 0, "a", [1]))
    outbox.put(final(REF, 1))
    assert not outbox.put(publication(REF, 2, "b", [2]))  # after the final: its own event
    assert not outbox.put(publication(REF, 3, "c", [3], choice=1))
    assert [item.event.seq for item in outbox.take()] == [0, 1, 2, 3]
    assert not outbox.put(publication(REF, 4, "d", [4])), "taken items are never touched again"
    outbox.put(JobDone(REF))
    assert not outbox.put(publication(REF, 5, "e", [5]))
    assert [type(item).__name__ for item in outbox.take()] == ["Publication", "JobDone", "Publication"]


def test_take_empties_the_outbox() -> None:
    outbox = Outbox()
    assert not outbox and outbox.take() == []
    outbox.put(publication(REF, 0, "a", [1]))
    assert outbox
    assert [item.event.text for item in outbox.take()] == ["a"]
    assert not outbox and outbox.take() == []


class SlowSink:
    """A sink whose round trip takes 20 ms: what the owner makes meanwhile waits in the outbox."""

    def __init__(self) -> None:
        self.outbox = Outbox()
        self.published: list[Publication | JobDone] = []
        self.done = threading.Event()
        self._answered_at = 0.0

    def put(self, item) -> bool:
        return self.outbox.put(item)

    def due(self) -> bool:
        return time.monotonic() >= self._answered_at

    def pump(self, wait_s: float) -> bool:
        if self.outbox and time.monotonic() >= self._answered_at:
            self.published.extend(self.outbox.take())
            self._answered_at = time.monotonic() + 0.02
            if isinstance(self.published[-1], JobDone):
                self.done.set()
        elif wait_s:
            time.sleep(wait_s)
        return bool(self.outbox)


def test_an_owner_ahead_of_a_slow_publisher_sends_fewer_events_with_every_token_once() -> None:
    text = "The quick brown fox jumps over the lazy dog, and then it runs far away."
    script = ids_of(text)
    sink = SlowSink()
    capacity = Capacity(4)
    owner = Owner(
        ScriptedStepper(script, step_delay_s=0.002, counters=WorkerCounters()),
        TOKENIZER,
        OwnerConfig("w", "none", 4, 100, 64),
        capacity,
        sink,
    )
    thread = threading.Thread(target=owner.run)
    thread.start()
    job = spec()
    capacity.hold(1)
    owner.inbox.put(StartJob(job, JobRef(job.request_id, "stream", "1-0", 1)))
    assert sink.done.wait(30)
    owner.inbox.put(StopOwner())
    thread.join(10)
    published = sink.published

    events = [item.event for item in published if isinstance(item, Publication)]
    deltas = [event for event in events if isinstance(event, StepDelta)]
    assert [event.seq for event in events] == list(range(len(events))), "seq stays contiguous"
    assert [token for event in deltas for token in event.token_ids] == script, "every token once, in order"
    assert "".join(event.text for event in deltas) == text
    assert len(deltas) < len(script) / 2, "steps that waited went out together"
    assert isinstance(events[-1], FinalEvent) and events[-1].usage.completion_tokens == len(script)
    assert isinstance(published[-1], JobDone)


def test_a_stream_interval_holds_a_jobs_deltas_until_they_carry_enough_tokens() -> None:
    outbox = Outbox()
    outbox.put(publication(REF, 0, "a", [1], first_output=True))  # a job's first output: due at once
    outbox.put(publication(OTHER, 3, "x", [9]))
    assert [(item.ref, item.event.seq) for item in outbox.take(stream_interval=3)] == [(REF, 0)]
    outbox.put(publication(REF, 1, "b", [2]))
    assert outbox.put(publication(REF, 2, "c", [3])), "held deltas still merge"
    assert outbox.take(stream_interval=3) == [] and outbox, "2 tokens each: nothing due yet"
    assert outbox.put(publication(OTHER, 4, "y", [10]))
    assert outbox.put(publication(REF, 3, "d", [4]))
    [ours] = outbox.take(stream_interval=3)
    assert (ours.event.seq, ours.event.token_ids, ours.event.text) == (1, [2, 3, 4], "bcd")
    outbox.put(final(OTHER, 5))  # a final takes its job's held delta along
    assert [item.event.seq for item in outbox.take(stream_interval=3)] == [3, 5]
    outbox.put(publication(REF, 4, "e", [5]))
    assert [item.event.seq for item in outbox.take(stream_interval=3, flush=True)] == [4], "flush: all of it"
    assert not outbox


def test_urgent_while_a_first_output_final_or_ack_waits() -> None:
    outbox = Outbox()
    outbox.put(publication(REF, 0, "", [1], first_output=True))  # no text yet: still urgent
    assert outbox.urgent
    assert outbox.put(publication(REF, 1, "a", [2], first_output=True))
    assert outbox.urgent
    outbox.take()
    outbox.put(publication(REF, 2, "b", [3]))
    assert outbox and not outbox.urgent, "a later delta may wait"
    outbox.put(publication(OTHER, 5, "", [4], first_output=True))
    assert outbox.urgent
    outbox.take()
    for item in (final(REF, 3), JobDone(REF)):
        outbox.put(item)
        assert outbox.urgent
        outbox.take()
        assert not outbox.urgent


def test_a_first_output_merged_into_a_held_delta_makes_it_urgent() -> None:
    # A resumed job: its first delta of this attempt carries output the client has not seen yet
    outbox = Outbox()
    outbox.put(publication(REF, 4, "", [1]))
    assert not outbox.urgent
    assert outbox.put(publication(REF, 5, "a", [2], first_output=True))
    assert outbox.urgent
    [item] = outbox.take(stream_interval=8)
    assert item.event.token_ids == [1, 2] and not outbox.urgent


def test_a_stream_interval_leaves_what_is_not_due_and_not_urgent() -> None:
    outbox = Outbox()
    outbox.put(publication(REF, 3, "a", [1]))
    outbox.put(publication(OTHER, 0, "x", [9], first_output=True))
    assert [item.ref for item in outbox.take(stream_interval=4)] == [OTHER]
    assert outbox and not outbox.urgent
