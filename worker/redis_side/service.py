"""The worker process's asyncio side: Redis in, Redis out, and the owner thread in between.

Tasks, each owned by `WorkerService.run` and cancelled when it returns:
  heartbeat   beats every interval (ready=0 until the model is loaded and warmed up), touches held entries
  reader      XREADGROUP one job at a time from each stream (`worker.redis_side.job_streams`), while a
              lane is free, or with every lane busy, of a class better than the worst running lane
  reclaimer   XAUTOCLAIMs dead workers' jobs into free lanes (see `worker.redis_side.reclaim`)
  control     the control channel: cancels reach the owner before the lane's next step
  cancel keys polled for held jobs, for cancels published while this worker was not listening
and, outside the event loop, the owner thread, which also publishes what it makes: events and
acks in order, fenced, over a connection of its own, never waiting for Redis while there is a step
to run (see `worker.redis_side.publisher`); deltas that pile up while Redis is behind go out merged (see
`worker.redis_side.outbox`).

Every loop survives Redis going away: connection errors back off (exponentially, capped) and
retry; publishing is idempotent on seq, so a retried batch never duplicates an event. After a
Redis restart (data gone) the consumer group is recreated and held jobs are found no longer ours.

Shutdown (SIGTERM): stop reading, let the lanes finish within the drain grace, acknowledge them,
then drop the heartbeat. Jobs still running at the end stay pending and are reclaimed elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import redis
import redis.asyncio
import redis.exceptions
from redis.asyncio import Redis

from shared import keys
from shared.heap import freeze_startup_heap
from shared.protocol import parse_control
from shared.redis_connect import async_client, sync_pool
from shared.sampling import SamplingParams
from shared.settings import DEFAULT_PUBLISH_BUDGET, WorkerSettings
from worker.engine.generate import generate
from worker.kernels.build import default_cache_dir
from worker.models.kv_pool import DEFAULT_MAX_KV_CACHE_BYTES
from worker.models.pool_factory import new_pool
from worker.redis_side.heartbeat import WorkerIdentity, beat, heartbeat, retire
from worker.redis_side.intake import Intake
from worker.redis_side.job_streams import JobStreams
from worker.redis_side.publisher import Publisher
from worker.redis_side.redis_io import RedisIO
from worker.serving.capacity_gate import log_capacity, start_capacity
from worker.serving.handoff import JobRef, JobSpec, WorkerCounters
from worker.serving.model_stepper import ModelStepper
from worker.serving.owner import Capacity, DropJob, Owner, OwnerConfig, StartJob, StopOwner
from worker.serving.prefix_cache import PrefixCache
from worker.serving.step_cost_cache import cached_or_measured
from worker.serving.step_cost_probe import COST_LANE_COUNTS, step_cost_key
from worker.serving_model import ServingModel
from worker.speculation.step_costs import StepCosts

log = logging.getLogger(__name__)

REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.05, 2.0
READ_BLOCK_MS = 500
FREE_LANE_POLL_S = 0.01
# Cancels arrive by pub/sub; a job's key is also read once as it is handed over (a cancel sent
# before the job was ours went unheard) and after every resubscription. This poll of all held
# jobs' keys is the net under a message lost otherwise.
CANCEL_POLL_S = 2.0
WARMUP_TOKENS = 2
OWNER_EXIT_WAIT_S = 30.0  # a running owner stops before its next step: this is a backstop
LOADING_EXIT_WAIT_S = 1.0  # a loading one cannot be told to stop: give it a moment, then leave it
TASKS_EXIT_WAIT_S = 5.0  # cancelled loops end at their next await; this bounds one that does not


@dataclass(slots=True, frozen=True)
class ServiceConfig:
    worker_id: str
    model_name: str  # the served name: the stream this worker reads
    speculation: str
    redis_url: str
    max_lanes: int = 8
    max_context: int | None = None  # tokens a lane holds; None: the model's own maximum, as far as memory allows
    # the KV pool; None: room for every lane at full context, at most 2 GiB and 90% of the free memory
    kv_cache_bytes: int | None = None
    max_batch_tokens: int = 256  # rows of one step
    adaptive_speculation: bool = True  # draft lengths from step costs measured at start-up
    step_costs_dir: Path | None = None  # where measured step costs are kept between starts; None: not kept
    prefill_cache_bytes: int = 256 * 1024 * 1024
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 5.0
    max_attempts: int = 3
    drain_grace_s: float = 30.0
    redis_timeout_s: float = 5.0
    redis_min_replicas: int = 0  # replicas that confirm each event batch (WAIT) before it counts
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0  # 0: no /metrics endpoint of its own
    stream_interval: int = 1  # tokens a delta gathers before it is published (first output: at once)
    publish_interval_s: float = 0.005  # least time between event batches while steps run (see Publisher)
    publish_budget: float = (
        DEFAULT_PUBLISH_BUDGET  # share of the owner's time publishing may take: stretches the interval
    )
    orphan_timeout_s: float = 10.0  # a job no gateway has heard for this long is cancelled; 0: never
    model_aliases: tuple[str, ...] = ()  # more names for the model, mapped to model_name by the gateway

    @classmethod
    def from_settings(cls, settings: WorkerSettings, speculation: str | None = None) -> ServiceConfig:
        return cls(
            worker_id=settings.worker_id,
            model_name=settings.model_name,
            model_aliases=settings.model_aliases,
            speculation=speculation or settings.speculation,
            redis_url=settings.redis_url,
            max_lanes=settings.max_lanes,
            max_context=settings.max_context,
            kv_cache_bytes=settings.kv_cache_bytes,
            max_batch_tokens=settings.max_batch_tokens,
            adaptive_speculation=settings.adaptive_speculation,
            step_costs_dir=default_cache_dir(),
            prefill_cache_bytes=settings.prefill_cache_bytes,
            heartbeat_interval_s=settings.heartbeat_interval_s,
            heartbeat_ttl_s=settings.heartbeat_ttl_s,
            max_attempts=settings.max_attempts,
            drain_grace_s=settings.drain_grace_s,
            redis_timeout_s=settings.redis_timeout_s,
            redis_min_replicas=settings.redis_min_replicas,
            metrics_host=settings.metrics_host,
            metrics_port=settings.metrics_port,
            stream_interval=settings.stream_interval,
            orphan_timeout_s=settings.orphan_timeout_s,
            publish_interval_s=settings.publish_interval_ms / 1000,
            publish_budget=settings.publish_budget,
        )

    @property
    def stream(self) -> str:
        return keys.request_stream(self.model_name)


class WorkerService:
    def __init__(self, config: ServiceConfig, load_model: Callable[[], ServingModel], freeze_heap: bool = False):
        """`freeze_heap`: once the model is loaded, move everything allocated so far out of the
        garbage collector's reach (`shared.heap`). For a process that is the worker (`arbor
        worker`), not for one that hosts it among other things (tests)."""
        assert config.redis_timeout_s * 1000 > READ_BLOCK_MS, "a blocking read must end before its socket times out"
        self.config = config
        self.load_model = load_model
        self.freeze_heap = freeze_heap
        self.counters = WorkerCounters()
        self.capacity = Capacity(config.max_lanes)
        self.identity = WorkerIdentity(
            config.worker_id,
            config.model_name,
            config.speculation,
            config.max_lanes,
            config.max_context or 0,  # 0 (unknown) until the model is loaded
            time.time(),
            config.model_aliases,
        )
        self._owner: Owner | None = None
        self._publisher_in_use: Publisher | None = None  # the owner thread's, once made (read by /metrics)
        self._held: dict[str, JobRef] = {}  # jobs handed to the owner, by request id
        self._cancel_sent: set[str] = set()
        self._key_checks: set[asyncio.Task] = set()  # cancel-key reads of jobs just handed over
        self._draining = False
        self._ready = False
        # Stopped while the model was loading, and not waiting for it: a process should then leave
        # with os._exit, as the interpreter's shut-down under a thread inside torch can crash.
        self.abandoned_loading = False

    @property
    def ready(self) -> bool:
        return self._ready

    @property
    def draining(self) -> bool:
        return self._draining

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set, then drain. Raises if the model cannot be loaded."""
        client = async_client(self.config.redis_url, self.config.redis_timeout_s)
        stop_metrics = self._serve_metrics()
        try:
            await self._serve(client, stop)
        finally:
            await client.aclose()
            stop_metrics()

    def _serve_metrics(self) -> Callable[[], None]:
        """Serve /metrics if a port is set; returns what stops it."""
        if not self.config.metrics_port:
            return lambda: None
        from worker.redis_side.metrics import WorkerCollector, serve_metrics, stop_metrics

        collector = WorkerCollector(
            self.identity,
            self.counters,
            lambda: self.capacity.held,
            lambda: self._publisher_in_use.interval_s if self._publisher_in_use else 0.0,
        )
        ready = lambda: self._ready and not self._draining  # noqa: E731
        server = serve_metrics(collector, self.config.metrics_host, self.config.metrics_port, ready)
        return lambda: stop_metrics(server)

    async def _serve(self, client: Redis, stop: asyncio.Event) -> None:
        self.io = RedisIO(client, self.config.worker_id)
        self._streams = JobStreams(self.io, self.config.model_name, int(self.config.heartbeat_ttl_s * 1000))
        self._intake = Intake(
            self.io, self.config.stream, self.config.max_attempts, self.config.max_lanes, self._hand_over
        )
        loop = asyncio.get_running_loop()
        publisher = self._publisher_in_use = self._publisher(loop)
        owner_ready: asyncio.Future[Owner] = loop.create_future()
        owner_exit: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(
            target=self._owner_main, args=(loop, publisher, owner_ready, owner_exit), name="arbor-owner", daemon=True
        )
        thread.start()
        tasks = [asyncio.create_task(self._forever("heartbeat", self._heartbeat_once), name="heartbeat")]
        try:
            first = await _first(owner_ready, stop, owner_exit)
            assert first is None or isinstance(first, Owner)  # owner_ready's result; None for the other two
            self._owner = first
            if self._owner is None and owner_ready.done() and not owner_ready.exception():
                self._owner = owner_ready.result()  # ready just as the stop came: stopped like a running one
            if self._owner is None or stop.is_set():
                return
            group = asyncio.create_task(self._forever_until_ok("consumer group", self._streams.ensure_groups))
            tasks.append(group)  # owned like the loops: cancelled at shut-down if Redis never answers
            await _first(stop, group)
            if stop.is_set():
                return
            tasks += self._start_serving_tasks()
            self._ready = True
            log.info("worker %s ready on %s", self.config.worker_id, self.config.stream)
            await _first(stop, owner_exit)
            await self._drain(owner_exit)
        finally:
            await self._shut_down(tasks, thread, client, owner_exit)

    def _start_serving_tasks(self) -> list[asyncio.Task]:
        loops: dict[str, Callable[[], Awaitable[None]]] = {
            "reader": self._read_once,
            "reclaimer": self._reclaim_once,
            "control": self._control_once,
            "cancel-keys": self._poll_cancel_keys_once,
        }
        return [asyncio.create_task(self._forever(name, body), name=name) for name, body in loops.items()]

    def _publisher(self, loop: asyncio.AbstractEventLoop) -> Publisher:
        """The owner thread's publisher; it connects on its first batch."""
        config = self.config
        pool = sync_pool(config.redis_url, config.redis_timeout_s)
        return Publisher(
            pool,
            config.worker_id,
            config.stream,
            config.redis_timeout_s,
            on_lost=lambda request_id: loop.call_soon_threadsafe(self._lose, request_id),
            on_done=lambda ref: loop.call_soon_threadsafe(self._finished, ref),
            stream_interval=config.stream_interval,
            orphan_timeout_s=config.orphan_timeout_s,
            publish_interval_s=config.publish_interval_s,
            publish_budget=config.publish_budget,
            min_replicas=config.redis_min_replicas,
            on_orphaned=lambda request_id: loop.call_soon_threadsafe(self._orphaned, request_id),
        )

    # -- the owner thread -------------------------------------------------------------------

    def _owner_main(
        self, loop: asyncio.AbstractEventLoop, publisher: Publisher, ready: asyncio.Future, exited: asyncio.Future
    ) -> None:
        waiting = ready  # the future a failure goes to: loading first, then running
        try:
            owner = self._build_owner(publisher)
            if self.abandoned_loading:
                return  # the service stopped while the model loaded, and is gone
            if self.freeze_heap:
                freeze_startup_heap()
            loop.call_soon_threadsafe(_resolve, ready, owner)
            waiting = exited
            owner.run()
            publisher.flush(self.config.redis_timeout_s)  # what is left unsent stays, as a crash would leave it
            loop.call_soon_threadsafe(_resolve, exited, None)
        except BaseException as error:  # the owner thread's edge: hand the failure to the event loop
            if self.abandoned_loading:
                return
            log.exception("owner thread failed")
            loop.call_soon_threadsafe(_fail_future, waiting, error)
        finally:
            publisher.close()

    def _build_owner(self, publisher: Publisher) -> Owner:
        served = self.load_model()
        warm_up(served)
        self._intake.served = served
        config = self.config
        cache = PrefixCache(config.prefill_cache_bytes) if config.prefill_cache_bytes > 0 else None
        runner = served.runner
        kv_cache_bytes, max_lanes = self._fit_capacity(served)
        self.capacity.max_lanes = max_lanes  # (fewer than asked where a hybrid's states do not fit)
        stepper = ModelStepper(runner, cache, self.counters, new_pool(runner.decoder, kv_cache_bytes, max_lanes))
        if config.adaptive_speculation:
            key = step_cost_key(served, stepper.max_draft, COST_LANE_COUNTS)
            stepper.step_costs = cached_or_measured(config.step_costs_dir, key, stepper.measure_step_costs)
            if stepper.step_costs is not None:
                log.info("decode step costs (lanes, draft tokens) -> ms: %s", _costs_ms(stepper.step_costs.prior))
        owner_config = OwnerConfig(
            config.worker_id, config.speculation, max_lanes, kv_cache_bytes, config.max_batch_tokens
        )
        return Owner(stepper, served.tokenizer, owner_config, self.capacity, publisher)

    def _fit_capacity(self, served: ServingModel) -> tuple[int, int]:
        """The capacity gate (worker/serving/capacity_gate.py): sizes the cache, fits the runner's
        context to it, logs and publishes what fits; returns the cache's bytes and the lanes that
        may run at once."""
        config, runner = self.config, served.runner
        full_lanes = config.max_lanes * ModelStepper(runner).kv_bytes(runner.max_context, 0)
        formats = served.loaded.formats
        start = start_capacity(
            runner,
            formats.body if formats is not None else None,
            config.kv_cache_bytes,
            min(full_lanes, DEFAULT_MAX_KV_CACHE_BYTES),
            config.max_lanes,
        )
        runner.max_context = start.max_context
        served.context_limit = start.limit_note
        self.counters.capacity = start.capacity
        self.identity = replace(self.identity, max_context=start.max_context)
        log_capacity(start)
        return start.kv_cache_bytes, start.max_lanes

    # -- loops (one iteration each; `_forever` repeats them and rides out Redis outages) ----------

    async def _forever(self, name: str, once: Callable[[], Awaitable[None]]) -> None:
        delay = BACKOFF_MIN_S
        while True:
            _end_if_cancelled()
            try:
                await once()
                delay = BACKOFF_MIN_S
                continue
            except REDIS_DOWN as error:
                log.warning("%s: redis unavailable (%s); retrying in %.2fs", name, error, delay)
            except redis.exceptions.ResponseError as error:
                if "NOGROUP" in str(error):
                    log.warning("%s: the consumer group is gone (redis restarted?); recreating it", name)
                    await self._forever_until_ok(name, self._streams.ensure_groups)
                    continue
                log.exception("%s: redis refused a command", name)
            except Exception:  # a loop must not die quietly: log, back off, go on
                log.exception("%s: unexpected error", name)
            await asyncio.sleep(delay)
            delay = min(2 * delay, BACKOFF_MAX_S)

    async def _forever_until_ok(self, name: str, once: Callable[[], Awaitable[None]]) -> None:
        delay = BACKOFF_MIN_S
        while True:
            _end_if_cancelled()
            try:
                await once()
                return
            except REDIS_DOWN as error:
                log.warning("%s: redis unavailable (%s); retrying in %.2fs", name, error, delay)
                await asyncio.sleep(delay)
                delay = min(2 * delay, BACKOFF_MAX_S)

    async def _heartbeat_once(self) -> None:
        capacity = self.capacity
        # Draining, it takes no more jobs: all lanes busy, so no gateway offers it one (placement)
        lanes_busy = self.identity.lanes_total if self._draining else capacity.held
        beat_fields = heartbeat(
            self.identity,
            self.counters,
            self._ready,
            lanes_busy,
            capacity.waiting_by_class,
            capacity.preemptions_by_class,
        )
        await beat(self.io.redis, beat_fields, self.config.heartbeat_ttl_s)
        by_stream: dict[str, list[str]] = {}
        for ref in self._held.values():
            by_stream.setdefault(ref.stream, []).append(ref.entry_id)
        for stream, entry_ids in by_stream.items():
            await self.io.touch(stream, entry_ids)
        await asyncio.sleep(self.config.heartbeat_interval_s)

    async def _read_once(self) -> None:
        """With a lane free: the offer stream and every class (blocking). With none, a job of a
        class better than the worst running lane, which it will preempt (not blocking, and only
        while no accepted lane waits already: one preemption at a time)."""
        if self._draining:
            await asyncio.sleep(FREE_LANE_POLL_S)
            return
        await self._streams.refresh()
        capacity = self.capacity
        if capacity.free() > 0:
            entries = await self.io.read_streams(self._streams.for_free_lanes(), 1, READ_BLOCK_MS)
        else:
            worst = capacity.worst_running
            better = self._streams.better_than(worst) if worst is not None and not capacity.num_waiting else []
            entries = await self.io.read_streams(better, 1, None) if better else []
            if not entries:
                await asyncio.sleep(FREE_LANE_POLL_S)
        for stream, entry_id, fields in entries:
            await self._intake.accept(entry_id, fields, first_delivery=True, stream=stream)

    async def _reclaim_once(self) -> None:
        await asyncio.sleep(self.config.heartbeat_interval_s)
        if self._draining:
            return
        for stream, entry_id, fields in await self._streams.reclaim(self.capacity.free()):
            log.info("reclaimed entry %s (%s) from %s", entry_id, fields.get("id"), stream)
            self.counters.redeliveries += 1
            await self._intake.accept(entry_id, fields, stream=stream)

    async def _control_once(self) -> None:
        pubsub = self.io.redis.pubsub(ignore_subscribe_messages=True)
        try:
            await pubsub.subscribe(keys.CONTROL_CHANNEL)
            await self._poll_cancel_keys()  # cancels sent while we were not subscribed
            while True:
                message = await pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._on_control(message["data"])
        finally:
            await pubsub.aclose()

    def _on_control(self, data: str) -> None:
        try:
            request_id = parse_control(data).id
        except ValueError:
            log.warning("ignoring a malformed control message: %.200r", data)
            return
        self._send_cancel(request_id)

    async def _poll_cancel_keys_once(self) -> None:
        await self._poll_cancel_keys()
        await asyncio.sleep(CANCEL_POLL_S)

    async def _poll_cancel_keys(self) -> None:
        request_ids = [rid for rid in self._held if rid not in self._cancel_sent]
        if not request_ids:
            return
        async with self.io.redis.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.exists(keys.cancel_key(request_id))
            found = await pipe.execute()
        for request_id, exists in zip(request_ids, found):
            if exists:
                self._send_cancel(request_id)

    def _send_cancel(self, request_id: str) -> None:
        if request_id in self._held and request_id not in self._cancel_sent and self._owner is not None:
            self._cancel_sent.add(request_id)
            self._owner.inbox.put(DropJob(request_id, cancelled=True))

    def _lose(self, request_id: str) -> None:
        """The job is no longer ours (reclaimed, or Redis lost it): stop working on it, quietly."""
        if self._held.pop(request_id, None) is not None and self._owner is not None:
            log.warning("job %s is no longer ours; dropping it", request_id)
            self._owner.inbox.put(DropJob(request_id, cancelled=False))
        self._cancel_sent.discard(request_id)

    def _orphaned(self, request_id: str) -> None:
        """No gateway has heard the job's events for the orphan timeout: its client is gone with
        its gateway (killed, say). Cancel it instead of running it to max_tokens for no one."""
        if request_id in self._held:
            log.warning(
                "nobody has listened to job %s for %.0fs (its gateway is gone?); cancelling it",
                request_id,
                self.config.orphan_timeout_s,
            )
            self._send_cancel(request_id)

    def _finished(self, ref: JobRef) -> None:
        """Acknowledged through the publisher: forget it (unless it is a newer delivery of the same job)."""
        if self._held.get(ref.request_id) == ref:
            del self._held[ref.request_id]
            self._cancel_sent.discard(ref.request_id)

    def _hand_over(self, spec: JobSpec, ref: JobRef) -> None:
        self.capacity.hold(spec.n)
        self._held[ref.request_id] = ref
        assert self._owner is not None
        self._owner.inbox.put(StartJob(spec, ref))
        # Read after the job is ours and running, so it costs the first token nothing: any cancel
        # from now on is heard by pub/sub, any before left its key.
        check = asyncio.create_task(self._cancelled_before_ours(ref.request_id), name="cancel-key")
        self._key_checks.add(check)
        check.add_done_callback(self._key_checks.discard)

    async def _cancelled_before_ours(self, request_id: str) -> None:
        try:
            if await self.io.redis.exists(keys.cancel_key(request_id)):
                self._send_cancel(request_id)
        except REDIS_DOWN as error:  # the poll looks again
            log.warning("could not read the cancel key of %s: %s", request_id, error)

    # -- shutting down ----------------------------------------------------------------------

    async def _drain(self, owner_exit: asyncio.Future) -> None:
        """Stop taking jobs; give the running ones the grace period to finish and be acknowledged."""
        self._draining = True
        deadline = time.monotonic() + self.config.drain_grace_s
        while self._held and time.monotonic() < deadline and not owner_exit.done():
            await asyncio.sleep(0.05)
        if self._held:
            log.warning("drain grace over; leaving %d jobs to be reclaimed", len(self._held))

    async def _shut_down(
        self, tasks: list[asyncio.Task], thread: threading.Thread, client: Redis, owner_exit: asyncio.Future
    ) -> None:
        self._ready = False
        if self._owner is not None:
            self._owner.inbox.put(StopOwner())
            await asyncio.to_thread(thread.join, OWNER_EXIT_WAIT_S)
        else:  # still loading the model, which cannot be interrupted: leave the (daemon) thread to it
            self.abandoned_loading = True  # a load that ends from now on finds nobody waiting, and returns
            await asyncio.to_thread(thread.join, LOADING_EXIT_WAIT_S)
            if thread.is_alive():
                log.warning("stopped while loading the model; not waiting for the load to finish")
        tasks = tasks + list(self._key_checks)
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=TASKS_EXIT_WAIT_S)
            for task in stuck:
                log.warning("loop %s did not stop when cancelled; leaving it", task.get_name())
        with contextlib.suppress(*REDIS_DOWN):
            async with asyncio.timeout(self.config.redis_timeout_s):
                await retire(client, self.config.worker_id)
        error = owner_exit.exception() if owner_exit.done() else None
        if error is not None:
            raise error


def warm_up(served: ServingModel) -> None:
    """One short generation, so the first request does not pay for lazy initialisation."""
    prompt_ids = served.encode_text("Hello") or [0]
    generate(served.runner, served.tokenizer, prompt_ids, SamplingParams(max_tokens=WARMUP_TOKENS))


async def _first(*waitables: asyncio.Future | asyncio.Event) -> object:
    """Wait for the first future to resolve or event to be set; its result (None for an event)."""
    waiters = {asyncio.ensure_future(w.wait()) if isinstance(w, asyncio.Event) else w: w for w in waitables}
    done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter, source in waiters.items():
        if waiter is not source:
            waiter.cancel()
    first = next(iter(done))
    return None if isinstance(waiters[first], asyncio.Event) else first.result()


def _end_if_cancelled() -> None:
    """A loop's check before each turn: a cancel that a client library swallowed (redis-py has had
    such bugs) still ends the loop, or shutting down would wait for it forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _resolve(future: asyncio.Future, value: object) -> None:
    if not future.done():
        future.set_result(value)


def _fail_future(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _costs_ms(costs: StepCosts) -> str:
    return ", ".join(f"{lanes},{k}: {seconds * 1000:.1f}" for (lanes, k), seconds in sorted(costs.seconds.items()))
