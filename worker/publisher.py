"""The publisher thread: the owner's events and acks to Redis, in order, fenced, off the event loop.

    owner thread --put--> Outbox --take--> publisher thread --one script call per batch--> Redis
                                                  |  fenced: on_lost(request id)    (event loop)
                                                  |  JobDone: complete, on_done(job ref)

Why a thread with a blocking client rather than an asyncio task: the owner thread needs the GIL
for every step of the model, so each microsecond of Python spent publishing is a microsecond the
model waits. A blocking call costs a fraction of what an event-loop wake-up plus redis-py's
asyncio machinery does, and the socket waits release the GIL. The event loop only hears about the
rare outcomes (a job lost, a job done).

Failures ride out like the service's loops: a batch that fails is retried as it was after a
capped backoff (publishing is idempotent on seq); a consumer group that vanished (Redis restarted
without its data) is recreated, and the retry then finds the jobs no longer ours.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis.exceptions

from worker.outbox import Item, Outbox
from worker.owner import JobDone
from worker.redis_io import BlockingEventIO, JobRef, Publication, PublishResult

log = logging.getLogger(__name__)

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0


class Publisher:
    def __init__(self, io: BlockingEventIO, outbox: Outbox, stream: str, on_lost: Callable[[str], None],
                 on_done: Callable[[JobRef], None]):
        self.io = io
        self.outbox = outbox
        self.stream = stream
        self._on_lost = on_lost  # called from this thread; must hand over to the event loop itself
        self._on_done = on_done
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="arbor-publisher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop after the batch in hand (what is still queued is left, as a crash would leave it)."""
        self._stopping.set()
        self.outbox.close()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopping.is_set():
            batch = self.outbox.take()
            if batch:
                self._deliver_until_done(batch)

    def _deliver_until_done(self, batch: list[Item]) -> None:
        delay = BACKOFF_MIN_S
        while not self._stopping.is_set():
            try:
                self.deliver(batch)
                return
            except REDIS_DOWN as error:
                log.warning("publisher: redis unavailable (%s); retrying in %.2fs", error, delay)
            except redis.exceptions.ResponseError as error:
                if "NOGROUP" not in str(error):
                    log.exception("publisher: redis refused a command")
                elif self._recreate_group():
                    continue
            except Exception:  # the thread must not die quietly: log, back off, go on
                log.exception("publisher: unexpected error")
            self._stopping.wait(delay)
            delay = min(2 * delay, BACKOFF_MAX_S)

    def deliver(self, batch: list[Item]) -> None:
        """Publications in runs (one script call each), each JobDone once the events before it landed."""
        publications: list[Publication] = []
        for item in batch:
            if isinstance(item, Publication):
                publications.append(item)
                continue
            self._publish(publications)
            publications = []
            self._finish(item)
        self._publish(publications)

    def _publish(self, publications: list[Publication]) -> None:
        for item, result in zip(publications, self.io.publish(publications)):
            if result is PublishResult.FENCED:
                self._on_lost(item.ref.request_id)

    def _finish(self, done: JobDone) -> None:
        self.io.complete(done.ref)  # fenced: a no-op for a job that is no longer ours
        self._on_done(done.ref)

    def _recreate_group(self) -> bool:
        log.warning("publisher: the consumer group is gone (redis restarted?); recreating it")
        try:
            self.io.ensure_group(self.stream)
            return True
        except REDIS_DOWN as error:
            log.warning("publisher: redis unavailable (%s)", error)
            return False
