"""What the owner has made but the publisher has not sent yet: in order, deltas merged while they wait.

The owner `put`s after each step; the publisher `take`s everything pending once the previous
batch has been answered. A delta put while its job's last pending item is a delta of the same
choice is merged into that item instead of queued behind it, so a publisher that falls behind the
model (Redis slower than a step) sends one event per job per round trip, not one per step, and
catches up:

    pending  [delta seq 4 "Hel" ids [7], final of another job]
    put      delta seq 5 "lo" ids [9]    -> True: merged, seq 5 stays free for the job's next event
    pending  [delta seq 4 "Hello" ids [7, 9], final of another job]

A publisher that keeps up takes every step as its own event: nothing waits to be merged. Seq
stays contiguous (the owner numbers only what it queued), and the event log still holds every
token published, in order (a reclaimer replays it: see `JobState`).

A pending delta is merged in place (`StepDelta.absorb`): until it is taken it is the outbox's
alone. Taken items are never touched again, so a batch whose publish failed is retried exactly as
it was.
Only the owner thread uses an outbox: no lock.

An item is *urgent* when holding it back would cost the client: a job's first visible output (the
deltas up to it included, flagged `first_output` by the owner), any final or error, and any ack.
The publisher holds a batch back (its publish interval) only while nothing urgent waits.

A stream interval above 1 (vLLM's `--stream-interval`) holds a job's deltas back until they carry
that many tokens: fewer, larger events when steps are so short that publishing each one costs a
noticeable share of it. A job's urgent items and everything before them in the job's order are
always due, and `take(flush=True)` takes everything (the owner has no step to run).
"""

from __future__ import annotations

from worker.serving.handoff import BatchItem, Publication
from worker.serving.step_delta import StepDelta


class Outbox:
    def __init__(self) -> None:
        self._items: list[BatchItem] = []
        self._last: dict[str, int] = {}  # request id -> index in _items of its last pending item

    def put(self, item: BatchItem) -> bool:
        """Queue an item; True if it was merged into a pending delta (no new seq)."""
        request_id = item.ref.request_id
        index = self._last.get(request_id)
        if index is not None and _merge_into(self._items[index], item):
            return True
        self._last[request_id] = len(self._items)
        self._items.append(item)
        return False

    @property
    def urgent(self) -> bool:
        """Something pending must not wait: see the module's docstring. (A few items at most, and
        asked only while some are pending, which a held lane makes rare.)"""
        return any(map(_urgent, self._items))

    def take(self, stream_interval: int = 1, flush: bool = False) -> list[BatchItem]:
        """Everything due, in order (with an interval of 1: everything); the rest stays, in order."""
        if stream_interval <= 1 or flush:
            items, self._items = self._items, []
            self._last.clear()
            return items
        due = {item.ref.request_id for item in self._items if _due(item, stream_interval)}
        taken = [item for item in self._items if item.ref.request_id in due]
        self._items = [item for item in self._items if item.ref.request_id not in due]
        self._last = {item.ref.request_id: index for index, item in enumerate(self._items)}
        return taken

    def __bool__(self) -> bool:
        return bool(self._items)


def _urgent(item: BatchItem) -> bool:
    if not isinstance(item, Publication) or not isinstance(item.event, StepDelta):
        return True  # a final, an error or an ack
    return item.first_output


def _due(item: BatchItem, stream_interval: int) -> bool:
    if _urgent(item):
        return True
    assert isinstance(item, Publication) and isinstance(item.event, StepDelta)  # what is not urgent: a delta
    return len(item.event.token_ids) >= stream_interval


def _merge_into(pending: BatchItem, item: BatchItem) -> bool:
    if not (isinstance(pending, Publication) and isinstance(item, Publication)):
        return False
    if not (isinstance(pending.event, StepDelta) and isinstance(item.event, StepDelta)):
        return False
    if not pending.event.absorb(item.event):  # in place: a pending item is the outbox's alone
        return False
    pending.first_output = pending.first_output or item.first_output
    return True
