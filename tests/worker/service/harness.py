"""Running a worker service in process (its own event loop thread), and playing the gateway's part."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis

from shared import keys
from shared.protocol import DeltaEvent, ErrorEvent, FinalEvent, Job, parse_event
from tests.support.waiting import wait_for
from worker.redis_side.service import ServiceConfig, WorkerService
from worker.serving_model import ServingModel

MODEL = "tiny"
AnyEvent = DeltaEvent | FinalEvent | ErrorEvent


def service_config(redis_url: str, **overrides: Any) -> ServiceConfig:
    fields = dict(
        worker_id=f"w-{uuid.uuid4().hex[:6]}",
        model_name=MODEL,
        speculation="none",
        adaptive_speculation=False,  # draft lengths from timed step costs would make speculation stats vary
        redis_url=redis_url,
        max_lanes=4,
        max_context=512,
        max_batch_tokens=32,
        heartbeat_interval_s=0.2,
        heartbeat_ttl_s=1.0,
        drain_grace_s=10.0,
        redis_timeout_s=2.0,
        orphan_timeout_s=0.0,
    )  # these tests play the gateway by reading the log, unsubscribed
    fields.update(overrides)
    return ServiceConfig(**fields)


class InProcessWorker:
    """`with InProcessWorker(config, served) as worker:` — ready on entry, drained and stopped on exit."""

    def __init__(self, config: ServiceConfig, served: ServingModel | Callable[[], ServingModel]):
        self.config = config
        self.service = WorkerService(config, served if callable(served) else (lambda: served))
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="test-worker", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._stop = asyncio.Event()
        try:
            self._loop.run_until_complete(self.service.run(self._stop))
        except BaseException as error:  # surfaced by stop()
            self.error = error
        finally:
            self._loop.close()

    def start(self) -> None:
        """Start serving without waiting for it to get ready (`with` waits)."""
        self._thread.start()

    def __enter__(self) -> InProcessWorker:
        self.start()
        wait_for(lambda: self.service.ready or not self._thread.is_alive(), 60, "the worker to get ready")
        assert self.service.ready, f"worker failed to start: {self.error!r}"
        return self

    def request_stop(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)

    def stop(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self.request_stop()
            self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the worker did not stop"

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        if self.error is not None and exc_info[0] is None:
            raise self.error


def chat_body(content: str | list, max_tokens: int = 16, **fields: Any) -> dict:
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **fields}


def completion_body(prompt: str, max_tokens: int = 16, **fields: Any) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **fields}


def submit(
    client: redis.Redis, body: dict, kind: str = "chat", deadline_s: float = 120.0, request_id: str | None = None
) -> str:
    """XADD a job the way the gateway does; returns its request id."""
    now = time.time()
    job = Job(
        id=request_id or f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}",
        model=MODEL,
        kind=kind,
        body=json.dumps(body),
        created=now,
        deadline=now + deadline_s,
    )
    client.xadd(keys.request_stream(MODEL), job.to_fields())
    return job.id


def events_of(client: redis.Redis, request_id: str) -> list[AnyEvent]:
    return [parse_event(raw) for raw in client.lrange(keys.event_log(request_id), 0, -1)]


def wait_done(client: redis.Redis, request_id: str, num_choices: int = 1, timeout_s: float = 60.0) -> list[AnyEvent]:
    """The request's events once it has ended (an error, or a final for every choice)."""

    def ended() -> list[AnyEvent] | None:
        events = events_of(client, request_id)
        finals = {e.choice for e in events if isinstance(e, FinalEvent)}
        done = any(isinstance(e, ErrorEvent) for e in events) or len(finals) == num_choices
        return events if done else None

    events = wait_for(ended, timeout_s, f"request {request_id} to end")
    assert [e.seq for e in events] == list(range(len(events))), "seq is contiguous and equals the log index"
    return events


def text_of(events: list[AnyEvent], choice: int = 0) -> str:
    return "".join(e.text for e in events if isinstance(e, DeltaEvent) and e.choice == choice)


def token_ids_of(events: list[AnyEvent], choice: int = 0) -> list[int]:
    return [t for e in events if isinstance(e, DeltaEvent) and e.choice == choice for t in e.token_ids]


def queue_is_clean(client: redis.Redis, request_id: str) -> bool:
    """Acknowledged, deleted from the stream, job state gone."""
    pending = client.xpending(keys.request_stream(MODEL), keys.CONSUMER_GROUP)["pending"]
    return (
        pending == 0 and client.xlen(keys.request_stream(MODEL)) == 0 and not client.exists(keys.job_state(request_id))
    )
