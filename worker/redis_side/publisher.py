"""Publishing from the owner thread: the owner's events and acks to Redis, in order, fenced, with
one batch in flight and never a wait while there is a step to run.

    owner thread: step -> put (Outbox) -> pump -> step -> put -> pump -> ...
                                           |  reply of the batch in flight, if it has come
                                           |  next batch out: one EVALSHA of the batch script,
                                           v  written to the socket, not waited for
                                         Redis (fenced: on_lost(request id); acked: on_done(job ref))

Why the owner thread itself, with no publisher thread: on a CPU the model's step is Python and
holds the GIL; a second thread that wakes for every step takes the GIL from it, and each hand-off
costs more than the publish. Measured on the tiny model (2 cores; docs/BENCHMARKS.md,
"Measurements behind the serving defaults"): a publisher thread cut the model's step rate to
0.71-0.82 of plain decoding, writing from the owner without waiting to 0.91-0.92. The write is one
system call; the reply is read at the next `pump`, after the next step, by which time it has long
arrived.

One batch in flight at a time: while Redis answers faster than a step (the normal case) every
step goes out as its own batch; when it is slower, the steps made meanwhile wait in the outbox
and go out merged (see `worker.redis_side.outbox`), so the publisher catches up instead of queueing.

A publish interval (`publish_interval_s`) spaces batches out while the owner has steps to run:
each batch wakes Redis, which wakes the gateway, which wakes the client, and on a small machine
each of those wake-ups costs the process making it tens of microseconds (measured on this
project's 2-core VM: a socket write that wakes a sleeping reader costs the writer 30-100 us,
about half of what publishing costs the owner; docs/BENCHMARKS.md). Deltas that wait merge, so
a step shorter than the interval shares its batch with the next. Nothing urgent ever waits (a
job's first visible output, finals, errors, acks: `Outbox.urgent`), and an owner with no step to
run sends at once. With steps longer than the interval (a real model on a GPU) every step still
goes out as its own batch.

A publish budget (`publish_budget`) stretches the interval where batches are dear: the owner's
CPU time per batch (building it, the write, reading the reply) is measured and smoothed, and the
interval grows to `cost / budget`, up to `MAX_STRETCHED_INTERVAL_S`, so that publishing takes at
most that share of the owner's time. The owner's cost stands for the whole batch's, which is ~5x
as much downstream (hence the small default, `shared.settings.DEFAULT_PUBLISH_BUDGET`). Where a
batch costs the owner ~10 microseconds (a host with cheap system calls) the configured interval
stands. On this project's 2-core VM a batch costs the owner ~180-210 us to send and answer (timed
with probes), with the caches cold after a step: at the 5 ms interval, a batch every ~2.6 steps of
the tiny model, ~4% of the owner's time (docs/BENCHMARKS.md, "Measurements behind the serving
defaults").

A job whose events nobody hears (PUBLISH reached no subscriber) for `orphan_timeout_s` is
reported through `on_orphaned`: its gateway died, and the service cancels it rather than run it to
`max_tokens` for no one.

Failures never stop the model: a batch whose send or reply failed (Redis down, a reply that
does not come within the timeout) is resent as it was after a capped backoff, over a new
connection (publishing is idempotent on seq, and acknowledging a job twice answers "not ours" the
second time). A script Redis no longer knows (restarted) is loaded again; a consumer group that
vanished (restarted without its data) is recreated, and the resend then finds the jobs no longer
ours. Callbacks run on the owner thread: they must hand over to the event loop themselves.

With `min_replicas` (a Redis with replicas, e.g. under Sentinel) each batch is followed on its
connection by `WAIT min_replicas timeout`, and counts as written only once that many replicas
have it: a batch they do not confirm is sent again (the script skips what already landed), so a
failover that loses the master's last writes cannot lose an event or a job's progress. Events
are published before they are confirmed: a client may see a token before its replica has it, and
the resend carries the same seq and text, which the gateway drops as a duplicate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import hiredis
import redis
import redis.exceptions

from shared import keys
from shared.redis_connect import NoReplica
from worker.redis_side.outbox import Outbox
from worker.redis_side.redis_io import BATCH_SCRIPT, PublishResult, batch_call
from worker.serving.handoff import BatchItem, JobDone, JobRef

log = logging.getLogger(__name__)

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0
MAX_STRETCHED_INTERVAL_S = 0.05  # a budget never spaces batches further apart: streams stay lively
COST_SMOOTHING = 0.1  # weight of the latest batch in the smoothed cost


class Publisher:
    def __init__(
        self,
        pool: redis.ConnectionPool,
        worker_id: str,
        stream: str,
        reply_timeout_s: float,
        on_lost: Callable[[str], object],  # what the callbacks return is ignored
        on_done: Callable[[JobRef], object],
        stream_interval: int = 1,
        orphan_timeout_s: float = 0.0,
        on_orphaned: Callable[[str], object] = lambda request_id: None,
        publish_interval_s: float = 0.0,
        publish_budget: float = 0.0,
        min_replicas: int = 0,
    ):
        self.pool = pool  # its settings make our connection, which is never borrowed: it stays ours
        self.worker_id = worker_id
        self.stream = stream
        self.reply_timeout_s = reply_timeout_s
        self._on_lost = on_lost
        self._on_done = on_done
        self.stream_interval = stream_interval  # tokens a job's delta gathers before it is sent
        self.publish_interval_s = publish_interval_s  # least time between batches while steps run
        self.publish_budget = publish_budget  # share of the owner's time batches may take; 0: no stretching
        self.interval_s = publish_interval_s  # the interval in force: publish_interval_s, stretched by the budget
        self._batch_cost_s = 0.0  # the owner's CPU time per batch, smoothed
        self._cost_so_far_s = 0.0  # spent on the batch in flight
        self.orphan_timeout_s = orphan_timeout_s  # 0: never give a job up for want of a listener
        self._on_orphaned = on_orphaned
        self._unheard_since: dict[str, float] = {}  # request id -> when its events stopped being heard
        self._orphaned: set[str] = set()
        self._outbox = Outbox()
        self.min_replicas = min_replicas  # replicas that must confirm a batch (WAIT); 0: none
        self._wait_ms = max(int(reply_timeout_s * 500), 1)  # half the reply timeout
        self._replies: list[object] = []  # the batch in flight's replies read so far (script, WAIT)
        self._connection: redis.connection.AbstractConnection | None = None
        self._sha = ""
        self._batch: list[BatchItem] | None = None  # taken from the outbox, not yet answered
        self._sent_at: float | None = None  # when the batch went out; None: (re)send it
        self._last_sent_at = 0.0  # when a batch last went out (sent or resent): the publish interval runs from it
        self._retry_at = 0.0
        self._backoff_s = BACKOFF_MIN_S

    def put(self, item: BatchItem) -> bool:
        """Queue an event or an ack; True if it was merged into a pending delta (no new seq)."""
        return self._outbox.put(item)

    def due(self) -> bool:
        """A delta put now would go out at the next `pump`: the publish interval has passed and no
        batch is in flight. The owner holds plain lanes' tokens until then (`worker.serving.owner`). The
        reply to the batch in flight is taken here if it has come: with steps longer than the
        interval it comes during the next step, and waiting for the `pump` after this question to
        read it would send only every other step."""
        if time.monotonic() - self._last_sent_at < self.interval_s:
            return False
        if self._batch is not None and self._sent_at is not None:
            self._guarded(self._take_reply, 0.0)
        return self._batch is None

    @property
    def busy(self) -> bool:
        """Something is unsent or unanswered."""
        return self._batch is not None or bool(self._outbox)

    def pump(self, wait_s: float = 0.0) -> bool:
        """Take the reply to the batch in flight if it has come (waiting up to `wait_s` for it, or
        for the end of a backoff), then send the next batch if there is one and it is time. A
        `wait_s` above 0 says the owner has no step to run: deltas held back by the stream or
        publish interval go out too. Returns `busy`."""
        self._guarded(self._pump, wait_s)
        return self.busy

    def _pump(self, wait_s: float) -> None:
        if self._batch is not None and self._sent_at is not None:
            self._take_reply(wait_s)
        if self._batch is None and self._outbox and self._time_to_send(wait_s):
            self._batch, self._sent_at = self._outbox.take(self.stream_interval, flush=wait_s > 0) or None, None
        if self._batch is not None and self._sent_at is None:
            delay = self._retry_at - time.monotonic()
            if delay > 0 and wait_s > 0:
                time.sleep(min(delay, wait_s))
            if time.monotonic() >= self._retry_at:
                self._send()

    def _guarded(self, io: Callable[[float], None], wait_s: float) -> None:
        try:
            io(wait_s)
        except REDIS_DOWN as error:
            self._failed(f"redis unavailable ({error})")
        except redis.exceptions.ResponseError as error:
            self._refused(error)
        except Exception:  # the owner thread must not die of a publishing bug: log, back off, go on
            log.exception("publisher: unexpected error")
            self._failed("unexpected error")

    def _time_to_send(self, wait_s: float) -> bool:
        return wait_s > 0 or self._outbox.urgent or time.monotonic() - self._last_sent_at >= self.interval_s

    def flush(self, timeout_s: float) -> bool:
        """Pump until nothing is left or `timeout_s` passes; True if everything was answered."""
        deadline = time.monotonic() + timeout_s
        while self.busy and time.monotonic() < deadline:
            self.pump(min(0.05, max(deadline - time.monotonic(), 0.0)))
        return not self.busy

    def close(self) -> None:
        self._disconnect()
        self.pool.disconnect()

    # -- one batch ---------------------------------------------------------------------------

    def _send(self) -> None:
        assert self._batch is not None
        connection = self._connection or self._connect()
        started = time.thread_time()  # after connecting: a batch's cost is what every batch pays
        script_keys, args = batch_call(self._batch, self.worker_id)
        # hiredis packs in C; redis-py's own packing costs the owner ~4x as much per step
        commands = [hiredis.pack_command(("EVALSHA", self._sha, len(script_keys), *script_keys, *args))]
        if self.min_replicas:
            wait: tuple[Any, ...] = ("WAIT", self.min_replicas, self._wait_ms)
            commands.append(hiredis.pack_command(wait))
        self._replies = []
        connection.send_packed_command(commands, check_health=False)
        self._sent_at = self._last_sent_at = time.monotonic()
        self._cost_so_far_s += time.thread_time() - started

    def _take_reply(self, wait_s: float) -> None:
        assert self._batch is not None and self._sent_at is not None and self._connection is not None
        connection = self._connection
        started = time.thread_time()
        try:
            if wait_s > 0 and not connection.can_read(timeout=wait_s):
                raise redis.exceptions.TimeoutError("not yet")
            # Between steps: one non-blocking read, the cheapest look (a partial reply stays buffered)
            while len(self._replies) < 1 + bool(self.min_replicas):
                self._replies.append(connection.read_response(timeout=0, disconnect_on_error=False))
        except redis.exceptions.TimeoutError:
            self._cost_so_far_s += time.thread_time() - started
            if time.monotonic() - self._sent_at > self.reply_timeout_s:
                raise redis.exceptions.TimeoutError(f"no reply within {self.reply_timeout_s:g}s") from None
            return
        results = self._replies[0]
        assert isinstance(results, list), results
        if self.min_replicas and int(str(self._replies[1])) < self.min_replicas:
            raise NoReplica(f"{self._replies[1]} of {self.min_replicas} replica(s) confirmed the batch")
        batch, self._batch, self._sent_at = self._batch, None, None
        self._backoff_s = BACKOFF_MIN_S
        now = time.monotonic()
        # A batch sent again (unconfirmed) may find a job it completed the first time gone: its
        # events are then fenced, yet the job is done, not lost, and its JobDone says so
        completed = {item.ref.request_id for item in batch if isinstance(item, JobDone)}
        for item, result in zip(batch, results, strict=True):
            request_id = item.ref.request_id
            if isinstance(item, JobDone) or result == PublishResult.FENCED:
                self._unheard_since.pop(request_id, None)  # the job is over for us
                self._orphaned.discard(request_id)
            if isinstance(item, JobDone):
                self._on_done(item.ref)  # acknowledged, or no longer ours: either way we are done with it
            elif result == PublishResult.FENCED and request_id not in completed:
                self._on_lost(request_id)
            elif result == PublishResult.UNHEARD:
                self._unheard(request_id, now)
            else:
                self._unheard_since.pop(request_id, None)
        self._count_cost(self._cost_so_far_s + time.thread_time() - started)

    def _count_cost(self, cost_s: float) -> None:
        """Fold one answered batch's cost into the smoothed cost, and stretch the interval to it."""
        self._cost_so_far_s = 0.0
        if not self.publish_budget:
            return
        self._batch_cost_s += COST_SMOOTHING * (cost_s - self._batch_cost_s)
        self.interval_s = stretched_interval(self.publish_interval_s, self._batch_cost_s, self.publish_budget)

    def _unheard(self, request_id: str, now: float) -> None:
        """Nobody subscribed heard the job's event: its gateway is gone if that lasts (a gateway
        reconnecting to Redis is back within seconds). Reported once, after `orphan_timeout_s`."""
        since = self._unheard_since.setdefault(request_id, now)
        if 0 < self.orphan_timeout_s <= now - since and request_id not in self._orphaned:
            self._orphaned.add(request_id)
            self._on_orphaned(request_id)

    # -- the connection and failures -----------------------------------------------------------

    def _connect(self) -> redis.connection.AbstractConnection:
        # Made from the pool's settings, not by the pool: the pool counts every connection it
        # makes against its limit and never forgets one, so reconnecting through it would stop
        # publishing for good after that many outages.
        connection: redis.connection.AbstractConnection = self.pool.connection_class(**self.pool.connection_kwargs)
        connection.connect()
        connection.send_command("SCRIPT", "LOAD", BATCH_SCRIPT)
        sha = connection.read_response()
        self._sha = sha.decode() if isinstance(sha, bytes) else sha
        self._connection = connection
        return connection

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.disconnect()

    def _failed(self, why: str) -> None:
        """Resend the batch as it was, over a new connection, after the backoff."""
        log.warning("publisher: %s; retrying in %.2fs", why, self._backoff_s)
        self._disconnect()
        self._sent_at = None
        self._retry_at = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, BACKOFF_MAX_S)

    def _refused(self, error: redis.exceptions.ResponseError) -> None:
        """An error reply: the batch did not run (NOSCRIPT) or stopped part-way (a script error)."""
        self._sent_at = None
        if self.min_replicas:
            self._disconnect()  # the WAIT's reply is still to come on it: never read it as another's
        if isinstance(error, redis.exceptions.NoScriptError):
            self._disconnect()  # the next send connects again, and loads the script first
            return
        if "NOGROUP" in str(error):
            log.warning("publisher: the consumer group is gone (redis restarted?); recreating it")
            try:
                self._recreate_group()
                return
            except REDIS_DOWN as down:
                self._failed(f"redis unavailable ({down})")
                return
            except redis.exceptions.ResponseError as other:
                error = other
        log.error("publisher: redis refused a batch: %s", error)
        self._failed("redis refused a batch")

    def _recreate_group(self) -> None:
        connection = self._connection or self._connect()
        connection.send_command("XGROUP", "CREATE", self.stream, keys.CONSUMER_GROUP, "0", "MKSTREAM")
        try:
            connection.read_response()
        except redis.exceptions.ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise


def stretched_interval(interval_s: float, batch_cost_s: float, budget: float) -> float:
    """The least time between batches for publishing to take at most `budget` of the owner's time
    at `batch_cost_s` a batch: never below `interval_s`, never above MAX_STRETCHED_INTERVAL_S
    (unless `interval_s` itself is). An interval of 0 asks for every step and is kept."""
    if interval_s == 0:
        return 0.0
    return max(interval_s, min(batch_cost_s / budget, MAX_STRETCHED_INTERVAL_S))
