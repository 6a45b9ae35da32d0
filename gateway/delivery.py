"""One request's events, in seq order, with nothing lost and nothing repeated.

Pub/sub may drop messages, so the reader trusts `seq`, not arrival:

    received 0, 1, 3      -> 3 is early: LRANGE eventlog 2 -1 recovers 2, then 2 and 3 are
                             handed out in order
    received 0, 1, (quiet for poll_s) -> LRANGE eventlog 2 -1 picks up anything published
                             but lost, e.g. a final event
    received 1 again      -> seq below next: a duplicate, dropped
    quiet, and the job's stream entry is gone with nothing new in the log -> JobLost: workers
                             XDEL the entry only after its last event, so that event would be
                             there; an entry gone without one was lost (e.g. Redis restarted empty)

A Redis that fails while the reader looks at the log (a failover, a restart from its append-only
file) is waited out for up to `REDIS_OUTAGE_S`: the worker resends what it could not write and the
log has it once Redis is back, so the stream goes on; a longer outage fails the request.

The event log's index equals seq (the worker RPUSHes and PUBLISHes in one transaction); if that
ever does not hold, the whole log is read and filtered by seq.

`ready()` looks at what has already arrived without waiting, so a caller that fell behind can
take several events at once (see `Generation.events`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys
from shared.protocol import DeltaEvent, ErrorEvent, FinalEvent, parse_event

AnyEvent = DeltaEvent | FinalEvent | ErrorEvent
DISCONNECTED = object()  # put on a request's queue when the client goes away
REDIS_OUTAGE_S = 30.0  # Redis failing this long ends a stream; a Sentinel failover takes ~2-5 s


class ClientGone(Exception):
    """The HTTP client disconnected."""


class DeadlineExceeded(Exception):
    """The request's deadline passed before its last event arrived."""


class ProtocolViolation(Exception):
    """The worker published something that is not a protocol event."""


class JobLost(Exception):
    """The job's stream entry is gone but its events stop short of its end: nothing more comes."""


class EventReader:
    def __init__(
        self,
        redis: Redis,
        request_id: str,
        queue: asyncio.Queue[object],  # raw event JSON (EventHub), or DISCONNECTED
        deadline: float,  # loop.time() by which the request must end
        poll_s: float,
        timeout_s: float,  # for each Redis call
        on_repair: Callable[[int], None] = lambda num_events: None,
        entry: tuple[str, str] | None = None,  # the job's (stream, entry id); None: no check
    ) -> None:
        self._redis = redis
        self._log_key = keys.event_log(request_id)
        self._queue = queue
        self._deadline = deadline
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._on_repair = on_repair
        self.entry = entry  # moved by the gateway when an unread offer goes to its class stream
        self._next_seq = 0
        self._early: dict[int, AnyEvent] = {}  # seq -> event received ahead of a gap
        self._gap_seen = False  # an event arrived ahead of the next one: read the log before waiting
        self._gone = False  # DISCONNECTED was taken off the queue by ready()
        self._failing_since: float | None = None  # loop.time() of the first Redis failure in a row

    async def next_event(self) -> AnyEvent:
        """The event with the next seq.

        Raises ClientGone, DeadlineExceeded, JobLost, ProtocolViolation."""
        while self._next_seq not in self._early:
            if self._gone:
                raise ClientGone
            if self._gap_seen:
                self._gap_seen = False
                await self._riding_out(self._read_log)
                continue
            await self._receive()
        event = self._early.pop(self._next_seq)
        self._next_seq += 1
        return event

    def ready(self) -> AnyEvent | None:
        """The event with the next seq if it has already arrived, without taking it; never waits."""
        while self._next_seq not in self._early and not self._gone and not self._queue.empty():
            self._take(self._queue.get_nowait())
        return self._early.get(self._next_seq)

    async def _receive(self) -> None:
        remaining_s = self._deadline - asyncio.get_running_loop().time()
        if remaining_s <= 0:
            raise DeadlineExceeded
        if self._queue.empty():
            try:
                async with asyncio.timeout(min(self._poll_s, remaining_s)):
                    item = await self._queue.get()
            except TimeoutError:
                await self._riding_out(self._read_log_after_silence)
                return
        else:
            item = self._queue.get_nowait()
        self._take(item)

    def _take(self, item: object) -> None:
        if item is DISCONNECTED:
            self._gone = True
            return
        assert isinstance(item, str | bytes), item  # else the raw JSON of an event (EventHub)
        event = _parse(item)
        self._keep(event)
        if event.seq > self._next_seq:
            self._gap_seen = True

    def _keep(self, event: AnyEvent) -> bool:
        if event.seq < self._next_seq or event.seq in self._early:
            return False
        self._early[event.seq] = event
        return True

    async def _riding_out(self, read: Callable[[], Awaitable[None]]) -> None:
        """`read()`, with a Redis failure waited out (the next silence tries again) unless Redis
        has been failing for REDIS_OUTAGE_S."""
        now = asyncio.get_running_loop().time()
        try:
            await read()
        except (RedisError, OSError, TimeoutError):
            self._failing_since = self._failing_since or now
            if now - self._failing_since >= REDIS_OUTAGE_S:
                raise
            return
        self._failing_since = None

    async def _read_log_after_silence(self) -> None:
        """Maybe the next event was published and lost; maybe the job was. The entry is looked at
        first: if it is gone, whatever its worker published before XDEL is in the log by now."""
        entry = self.entry
        entry_gone = entry is not None and not await self._entry_exists(*entry)
        await self._read_log()
        if entry_gone and self.entry == entry and self._next_seq not in self._early:
            raise JobLost  # (an entry that moved meanwhile was not lost)

    async def _entry_exists(self, stream: str, entry_id: str) -> bool:
        async with asyncio.timeout(self._timeout_s):
            return bool(await self._redis.xrange(stream, entry_id, entry_id, count=1))

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
