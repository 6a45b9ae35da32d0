"""One request's events, in seq order, with nothing lost and nothing repeated.

Pub/sub may drop messages, so the reader trusts `seq`, not arrival:

    received 0, 1, 3      -> 3 is early: LRANGE eventlog 2 -1 recovers 2, then 2 and 3 are
                             handed out in order
    received 0, 1, (quiet for poll_s) -> LRANGE eventlog 2 -1 picks up anything published
                             but lost, e.g. a final event
    received 1 again      -> seq below next: a duplicate, dropped

The event log's index equals seq (the worker RPUSHes and PUBLISHes in one transaction); if that
ever does not hold, the whole log is read and filtered by seq.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import ValidationError
from redis.asyncio import Redis

from shared import keys
from shared.protocol import DeltaEvent, ErrorEvent, FinalEvent, parse_event

AnyEvent = DeltaEvent | FinalEvent | ErrorEvent
DISCONNECTED = object()  # put on a request's queue when the client goes away


class ClientGone(Exception):
    """The HTTP client disconnected."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before its last event arrived."""


class ProtocolViolation(Exception):
    """The worker published something that is not a protocol event."""


class EventReader:
    def __init__(
        self,
        redis: Redis,
        request_id: str,
        queue: asyncio.Queue,
        deadline: float,  # loop.time() by which the request must end
        poll_s: float,
        timeout_s: float,  # for each Redis call
        on_repair: Callable[[int], None] = lambda num_events: None,
    ) -> None:
        self._redis = redis
        self._log_key = keys.event_log(request_id)
        self._queue = queue
        self._deadline = deadline
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._on_repair = on_repair
        self._next_seq = 0
        self._early: dict[int, AnyEvent] = {}  # seq -> event received ahead of a gap

    async def next_event(self) -> AnyEvent:
        """The event with the next seq. Raises ClientGone, DeadlineExceeded, ProtocolViolation."""
        while self._next_seq not in self._early:
            await self._receive()
        event = self._early.pop(self._next_seq)
        self._next_seq += 1
        return event

    async def _receive(self) -> None:
        remaining_s = self._deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            raise DeadlineExceeded
        try:
            item = await asyncio.wait_for(self._queue.get(), min(self._poll_s, remaining_s))
        except TimeoutError:
            await self._read_log()  # quiet: maybe the next event was published and lost
            return
        if item is DISCONNECTED:
            raise ClientGone
        event = _parse(item)
        self._keep(event)
        if event.seq > self._next_seq:
            await self._read_log()

    def _keep(self, event: AnyEvent) -> bool:
        if event.seq < self._next_seq or event.seq in self._early:
            return False
        self._early[event.seq] = event
        return True

    async def _read_log(self) -> None:
        async with asyncio.timeout(self._timeout_s):
            raw = await self._redis.lrange(self._log_key, self._next_seq, -1)
            events = [_parse(item) for item in raw]
            if events and events[0].seq != self._next_seq:  # index != seq: read it all
                events = [_parse(item) for item in await self._redis.lrange(self._log_key, 0, -1)]
        recovered = sum(self._keep(event) for event in events)
        if recovered:
            self._on_repair(recovered)


def _parse(raw: str | bytes) -> AnyEvent:
    try:
        return parse_event(raw)
    except ValidationError as exc:
        raise ProtocolViolation(f"{exc.error_count()} error(s) in {str(raw)[:200]!r}") from exc
