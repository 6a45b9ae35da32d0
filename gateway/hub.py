"""One pub/sub connection per gateway process, routing each request's event channel to a queue.

The gateway subscribes once, at start, to a pattern that matches the event channels of its own
requests only: every request id it makes carries its `token` (`chatcmpl-<token><uuid>`), and the
hub listens on `arbor:events:*-<token>*`. A request then needs no SUBSCRIBE of its own (one round
trip off every time-to-first-token, and no UNSUBSCRIBE at the end): `subscription(id)` registers a
queue and returns once the pattern subscription is confirmed, so the caller can XADD the job
knowing its events have a listener. Messages lost anyway (pub/sub is at-most-once, e.g. across a
reconnect, when redis-py subscribes the pattern again) are repaired by `delivery.EventReader` from
the event log; messages for requests that are over are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from redis.asyncio import Redis
from redis.exceptions import RedisError

from shared import keys

log = logging.getLogger(__name__)

READ_TIMEOUT_S = 1.0  # how long one get_message waits; bounds how fast stop() is noticed
RETRY_PAUSE_S = 0.5  # after a connection error, before reading again


class EventHub:
    def __init__(self, redis: Redis, timeout_s: float) -> None:
        self._pubsub = redis.pubsub()
        self._timeout_s = timeout_s
        self.token = uuid.uuid4().hex[:8]  # in every request id this gateway makes
        self._pattern = keys.events_channel(f"*-{self.token}*")
        self._queues: dict[str, asyncio.Queue[object]] = {}  # raw event JSON, and delivery.DISCONNECTED
        self._listening = asyncio.Event()  # the pattern subscription is confirmed
        self._reader: asyncio.Task[None] | None = None

    def request_id(self, prefix: str) -> str:
        """A new request id whose events this hub receives."""
        return f"{prefix}-{self.token}{uuid.uuid4().hex}"

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_forever(), name="arbor-event-hub")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        with anyio.move_on_after(self._timeout_s):
            await self._pubsub.aclose()

    @asynccontextmanager
    async def subscription(self, request_id: str) -> AsyncIterator[asyncio.Queue[object]]:
        """A queue that receives the raw JSON of every event published for `request_id` (an id
        from `request_id()`). Raises TimeoutError if the hub cannot listen (Redis down)."""
        channel = keys.events_channel(request_id)
        assert f"-{self.token}" in request_id, f"{request_id} is not one of this gateway's request ids"
        queue: asyncio.Queue[object] = asyncio.Queue()
        self._queues[channel] = queue
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._listening.wait()
            yield queue
        finally:
            self._queues.pop(channel, None)

    async def _read_forever(self) -> None:
        while True:
            try:
                if not self._pubsub.subscribed:
                    await self._pubsub.psubscribe(self._pattern)
                message = await self._pubsub.get_message(timeout=READ_TIMEOUT_S)
            except (RedisError, OSError) as exc:
                self._listening.clear()
                log.warning("event hub read failed, retrying: %s", exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            except Exception:  # keep routing for everyone else; requests repair from the log
                log.exception("event hub read crashed, retrying")
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "pmessage":
            queue = self._queues.get(message["channel"])
            if queue is not None:
                queue.put_nowait(message["data"])
        elif kind == "psubscribe":  # also after redis-py reconnected and subscribed the pattern again
            self._listening.set()
