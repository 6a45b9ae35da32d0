"""A stand-in worker that speaks `shared.protocol` over a real Redis, following a script.

It beats like a worker, XREADGROUPs jobs, re-validates each job body with the shared request
models, and plays a script per job: events (published, or written to the event log only, to
make a seq gap), pauses, and waits for the cancel key. Each event is one MULTI/EXEC:
RPUSH log, EXPIRE, PUBLISH, HSET job state, exactly as the protocol says.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from pydantic import BaseModel, ValidationError

from shared import keys
from shared.heartbeat import Heartbeat
from shared.openai_schema import ChatCompletionRequest, CompletionRequest
from shared.protocol import EVENT_LOG_TTL_S, JOB_STATE_TTL_S, Job, JobState, parse_event
from shared.tokenizer_api import TokenizerJob

BLOCK_MS = 50
HEARTBEAT_TTL_S = 3


@dataclass
class Emit:
    event: dict[str, Any]  # everything but id, attempt, seq
    publish: bool = True  # False: log it but lose the pub/sub message


@dataclass
class Pause:
    seconds: float


@dataclass
class WaitForCancel:
    timeout_s: float = 10.0


Step = Emit | Pause | WaitForCancel
Script = Callable[[Job], list[Step]]


def delta(text: str = "", choice: int = 0, **fields: Any) -> Emit:
    return Emit({"type": "delta", "choice": choice, "text": text, **fields})


def final(
    finish_reason: str = "stop",
    choice: int = 0,
    prompt_tokens: int = 7,
    completion_tokens: int = 2,
    **fields: Any,
) -> Emit:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens}
    return Emit({"type": "final", "choice": choice, "finish_reason": finish_reason, "usage": usage, **fields})


def error(message: str, code: str = "internal_error") -> Emit:
    return Emit({"type": "error", "message": message, "code": code})


def lost(step: Emit) -> Emit:
    """The same event, written to the event log but never published: a seq gap."""
    return Emit(step.event, publish=False)


def hello_script(job: Job) -> list[Step]:
    return [delta("Hello", token_ids=[1]), delta(", world", token_ids=[2, 3]), final(completion_tokens=3)]


@dataclass
class Counters:
    steps: int = 0
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    draft_sources: dict[str, dict[str, int]] = field(default_factory=dict)


@dataclass
class ProtocolPeer:
    redis_url: str
    model: str = "tiny-model"
    worker_id: str = "peer-1"
    script: Script = hello_script
    ready: bool = True
    consume: bool = True  # False: beat but never read the stream (a stuck fleet)
    speculation: str = "mtp"
    lanes_total: int = 4
    aliases: tuple[str, ...] = ()  # more names for `model` (a worker's --served-model-name name,alias)
    priorities: tuple[int, ...] = (0,)  # the priority classes whose streams it reads
    counters: Counters = field(default_factory=Counters)
    jobs: list[Job] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # protocol breaches seen; tests assert empty

    def __post_init__(self) -> None:
        self._redis = redis.Redis.from_url(self.redis_url, decode_responses=True, socket_timeout=5)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started_at = time.time()

    def start(self) -> ProtocolPeer:
        self.beat()
        for priority in self.priorities:
            try:
                self._redis.xgroup_create(
                    keys.request_stream(self.model, priority), keys.CONSUMER_GROUP, id="0", mkstream=True
                )
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
        self._spawn(self._run)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        self._redis.close()

    def beat(self) -> None:
        beat = Heartbeat(
            worker_id=self.worker_id,
            model=self.model,
            aliases=self.aliases,
            speculation=self.speculation,
            ready=self.ready,
            lanes_total=self.lanes_total,
            lanes_busy=0,
            max_context=2048,
            started_at=self._started_at,
            beat_at=time.time(),
            **vars(self.counters),
        )
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.worker_heartbeat(self.worker_id), mapping=beat.to_fields())
            pipe.expire(keys.worker_heartbeat(self.worker_id), HEARTBEAT_TTL_S)
            pipe.sadd(keys.WORKERS_SET, self.worker_id)
            pipe.execute()

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_beat:
                self.beat()
                next_beat = time.monotonic() + 0.5
            if not self.consume:
                time.sleep(BLOCK_MS / 1000)
                continue
            streams = {keys.request_stream(self.model, priority): ">" for priority in self.priorities}
            reply = self._redis.xreadgroup(keys.CONSUMER_GROUP, self.worker_id, streams, count=1, block=BLOCK_MS)
            for stream, entries in reply or []:
                for entry_id, fields in entries:
                    self._spawn(self._serve, stream, entry_id, Job.from_fields(fields))

    def _serve(self, stream: str, entry_id: str, job: Job) -> None:
        try:
            self._play(stream, entry_id, job)
        except Exception as exc:  # a broken script must fail the test, not vanish in a thread
            self.problems.append(f"{job.id}: {type(exc).__name__}: {exc}")

    def _play(self, stream: str, entry_id: str, job: Job) -> None:
        self.jobs.append(job)
        self._check_body(job)
        seq = 0
        for step in self.script(job):
            if isinstance(step, Pause):
                self._stop.wait(step.seconds)
            elif isinstance(step, WaitForCancel):
                self._wait_for_cancel(job, step.timeout_s)
            else:
                self._emit(job, seq, step)
                seq += 1
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(stream, keys.CONSUMER_GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.delete(keys.job_state(job.id))
            pipe.execute()

    def _emit(self, job: Job, seq: int, step: Emit) -> None:
        event = {"id": job.id, "attempt": job.attempt, "seq": seq, **step.event}
        raw = parse_event(json.dumps(event)).model_dump_json()  # validated, as a worker's would be
        state = JobState(worker=self.worker_id, attempt=job.attempt, emitted_token_ids=[[]], next_seq=seq + 1)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.rpush(keys.event_log(job.id), raw)
            pipe.expire(keys.event_log(job.id), EVENT_LOG_TTL_S)
            if step.publish:
                pipe.publish(keys.events_channel(job.id), raw)
            pipe.hset(keys.job_state(job.id), mapping=state.to_fields())
            pipe.expire(keys.job_state(job.id), JOB_STATE_TTL_S)
            pipe.execute()

    def _wait_for_cancel(self, job: Job, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self._stop.is_set():
            if self._redis.exists(keys.cancel_key(job.id)):
                self.cancelled.append(job.id)
                return
            time.sleep(0.02)

    def _check_body(self, job: Job) -> None:
        model: type[BaseModel] = {"completion": CompletionRequest, "tokenize": TokenizerJob}.get(
            job.kind, ChatCompletionRequest
        )
        try:
            model.model_validate_json(job.body)
        except ValidationError as exc:
            self.problems.append(f"{job.id}: body does not re-validate: {exc}")
        if job.deadline <= job.created:
            self.problems.append(f"{job.id}: deadline {job.deadline} not after created {job.created}")
