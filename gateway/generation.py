"""One accepted request, from XADD to its last event, with an owner for every loose end.

    gen = Generation(...)
    await gen.open()                         # SUBSCRIBE (confirmed), then XADD
    try:
        async for batch in gen.batches():    # deltas and finals in seq order, until every
            ...                              # choice has its final
    finally:
        await gen.close()                    # unless finished, cancel the job; UNSUBSCRIBE

The routes open it before the HTTP response starts and close it when the response ends, so it
outlives the handler.

`batches()` hands out every event that has already arrived at once, so a stream that fell behind
the worker (a slow client, a busy gateway) catches up with one write for several chunks; one that
keeps up gets each event as it arrives.

Failures surface as `GenerationFailed` carrying the ApiError to send; a client that goes away
surfaces as `ClientGone`. Either way `close()` cancels the job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from contextlib import AsyncExitStack

import anyio
from redis.exceptions import RedisError

from gateway import errors, jobs
from gateway.accumulate import Outcome
from gateway.delivery import (
    DISCONNECTED,
    ClientGone,
    DeadlineExceeded,
    EventReader,
    JobLost,
    ProtocolViolation,
)
from gateway.errors import ApiError
from gateway.middleware.disconnect import DisconnectWatch
from gateway.placement import take_back
from gateway.services import Services
from shared import keys
from shared.protocol import DeltaEvent, ErrorEvent, FinalEvent, Job
from shared.redis_connect import NoReplica

log = logging.getLogger(__name__)

_REDIS_FAILURES = (RedisError, OSError, TimeoutError)


class GenerationFailed(Exception):
    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


class Generation:
    def __init__(self, svc: Services, job: Job, num_choices: int, watch: DisconnectWatch, arrived: float) -> None:
        self._svc = svc
        self.job = job
        self._num_choices = num_choices
        self._watch = watch
        self._arrived = arrived  # loop.time() when the HTTP request came in
        self._stack = AsyncExitStack()
        self._reader: EventReader | None = None
        self._last_delta_at: float | None = None
        self.outcome = Outcome(num_choices)
        self.finished = False
        self._refused = False  # the queue was full: the job was never queued
        self._heard = False  # an event of the job arrived: a worker has it

    async def open(self) -> None:
        """Subscribe, then enqueue. Raises GenerationFailed or delivery.ClientGone, having closed
        whatever it opened."""
        try:
            await self._open()
        except BaseException as exc:
            await self._stack.aclose()
            if isinstance(exc, NoReplica):
                raise self._failed(errors.redis_no_replica(self._svc.settings.redis_min_replicas)) from exc
            if isinstance(exc, _REDIS_FAILURES):
                raise self._failed(errors.redis_unavailable(exc)) from exc
            raise

    async def close(self) -> None:
        """Unless finished, cancel the job; unsubscribe. A second call does nothing."""
        await self._stack.aclose()

    async def _open(self) -> None:
        svc = self._svc
        svc.metrics.running.inc()
        self._stack.callback(svc.metrics.running.dec)
        queue = await self._stack.enter_async_context(svc.hub.subscription(self.job.id))
        self._watch.add_listener(lambda: queue.put_nowait(DISCONNECTED))
        if self._watch.disconnected:
            raise ClientGone  # nobody to answer: do not queue work
        self._stack.push_async_callback(self._cancel_unless_finished)  # from here the job may exist
        try:
            async with asyncio.timeout(svc.settings.redis_timeout_s):
                queued = await jobs.enqueue(
                    svc.redis,
                    self.job,
                    svc.settings.max_queue,
                    svc.settings.placement,
                    svc.settings.redis_min_replicas,
                    wait_ms=int(svc.settings.redis_timeout_s * 500),  # half the timeout: a reply in time
                )
        except jobs.QueueFull as full:
            self._refused = True  # never queued: nothing to cancel
            raise GenerationFailed(errors.queue_full(self.job.model, full.length, svc.settings.retry_after_s)) from None
        self._reader = EventReader(
            svc.redis,
            self.job.id,
            queue,
            deadline=self._arrived + svc.settings.request_timeout_s,
            poll_s=svc.settings.event_poll_s,
            timeout_s=svc.settings.redis_timeout_s,
            on_repair=svc.metrics.event_repairs.inc,
            entry=(queued.stream, queued.entry_id),
        )
        if queued.stream != keys.request_stream(self.job.model, self.job.priority):
            stream, entry_id = queued.stream, queued.entry_id
            offer = asyncio.create_task(self._take_back_unread(stream, entry_id), name="offer-wait")
            self._stack.push_async_callback(self._end_offer, offer, stream, entry_id)

    async def _end_offer(self, offer: asyncio.Task[None], stream: str, entry_id: str) -> None:
        """On close: an offer still unread goes to its class stream, where a live worker reads it,
        finds its cancel key and drops it (left in the offer stream of a dead worker, it would
        stay there)."""
        offer.cancel()
        if self.finished or self._heard:
            return
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._svc.settings.redis_timeout_s):
            try:
                await take_back(self._svc.redis, self.job, stream, entry_id)
            except _REDIS_FAILURES as exc:
                log.warning("could not take back the offer of %s: %s", self.job.id, exc)

    async def _take_back_unread(self, stream: str, entry_id: str) -> None:
        """After the offer wait, the job goes to its class stream unless its worker has read it."""
        svc, reader = self._svc, self._reader
        assert reader is not None
        await asyncio.sleep(svc.settings.offer_wait_s)
        if self._heard:
            return
        reader.entry = None  # not "lost" while it moves
        try:
            async with asyncio.timeout(svc.settings.redis_timeout_s):
                moved = await take_back(svc.redis, self.job, stream, entry_id)
        except _REDIS_FAILURES as exc:
            log.warning("could not take back the offer of %s: %s", self.job.id, exc)
            moved = None
        reader.entry = (
            (stream, entry_id) if moved is None else (keys.request_stream(self.job.model, self.job.priority), moved)
        )

    async def batches(self) -> AsyncGenerator[list[DeltaEvent | FinalEvent], None]:
        """Deltas and finals in seq order, each batch the next one (waited for) and those after it
        already here. Raises GenerationFailed or delivery.ClientGone.

        A batch stops before an error or a malformed event, so everything before it is sent first.
        `finished` is already True when the last batch is handed out.
        """
        unfinished = set(range(self._num_choices))
        while unfinished:
            batch = [await self._next_event()]
            self._record(batch[-1], unfinished)
            while unfinished and self._deliverable(self._ready()):
                batch.append(await self._next_event())  # already here: taken without waiting
                self._record(batch[-1], unfinished)
            if not unfinished:
                self.finished = True
                self._observe_finish()
            yield batch

    def _record(self, event: DeltaEvent | FinalEvent, unfinished: set[int]) -> None:
        self._heard = True
        self.outcome.add(event)
        self._observe(event)
        if isinstance(event, FinalEvent):
            unfinished.discard(event.choice)

    def _deliverable(self, event: DeltaEvent | FinalEvent | ErrorEvent | None) -> bool:
        return isinstance(event, DeltaEvent | FinalEvent) and 0 <= event.choice < self._num_choices

    async def _next_event(self) -> DeltaEvent | FinalEvent:
        assert self._reader is not None, "events() before open()"
        try:
            event = await self._reader.next_event()
        except DeadlineExceeded:
            raise self._failed(errors.timed_out(self._svc.settings.request_timeout_s)) from None
        except JobLost:
            raise self._failed(errors.job_lost()) from None
        except ProtocolViolation as exc:
            raise self._failed(errors.protocol_violation(str(exc))) from exc
        except _REDIS_FAILURES as exc:
            raise self._failed(errors.redis_unavailable(exc)) from exc
        if isinstance(event, ErrorEvent):
            raise self._failed(errors.from_worker(event))
        if not 0 <= event.choice < self._num_choices:
            raise self._failed(errors.protocol_violation(f"choice {event.choice} of {self._num_choices}"))
        return event

    def _ready(self) -> DeltaEvent | FinalEvent | ErrorEvent | None:
        assert self._reader is not None, "events() before open()"
        try:
            return self._reader.ready()
        except ProtocolViolation as exc:
            raise self._failed(errors.protocol_violation(str(exc))) from exc

    def _failed(self, error: ApiError) -> GenerationFailed:
        self._svc.metrics.failures.labels(code=error.code).inc()
        return GenerationFailed(error)

    def _observe(self, event: DeltaEvent | FinalEvent) -> None:
        if self.job.kind in ("count", "tokenize"):
            return  # a prompt counted or tokenized, nothing generated: no request to report
        metrics = self._svc.metrics
        now = asyncio.get_running_loop().time()
        if isinstance(event, FinalEvent):
            metrics.success.labels(finish_reason=event.finish_reason).inc()
            if event.stats.queue_s is not None and event.choice == 0:
                metrics.queue_time.observe(event.stats.queue_s)
            return
        if self._last_delta_at is None:
            metrics.ttft.observe(now - self._arrived)
            metrics.ttft_by_class.labels(priority=str(self.job.priority)).observe(now - self._arrived)
        else:
            metrics.inter_token.observe(now - self._last_delta_at)
        self._last_delta_at = now

    def _observe_finish(self) -> None:
        if self.job.kind in ("count", "tokenize"):
            return
        metrics = self._svc.metrics
        usage = self.outcome.usage()
        metrics.e2e.observe(asyncio.get_running_loop().time() - self._arrived)
        metrics.prompt_tokens.inc(usage.prompt_tokens)
        metrics.generation_tokens.inc(usage.completion_tokens)

    async def _cancel_unless_finished(self) -> None:
        if self.finished or self._refused:
            return
        # Shielded: this runs while the stream is being cancelled because the client left.
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._svc.settings.redis_timeout_s):
            try:
                await jobs.cancel(self._svc.redis, self.job.id)
            except _REDIS_FAILURES as exc:
                log.warning("could not cancel %s: %s", self.job.id, exc)
