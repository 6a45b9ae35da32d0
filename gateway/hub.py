"""One pub/sub connection per gateway process, routing each request's event channel to a queue.

`subscription(id)` returns only after Redis has confirmed the SUBSCRIBE, so the caller can XADD
the job knowing no event can be published before it listens. Messages lost anyway (pub/sub is
at-most-once, e.g. across a reconnect) are repaired by `delivery.EventReader` from the event log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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
        self._queues: dict[str, asyncio.Queue] = {}
        self._confirmations: dict[str, asyncio.Future[None]] = {}
        self._commands = asyncio.Lock()  # one SUBSCRIBE/UNSUBSCRIBE on the wire at a time
        self._connected = asyncio.Event()  # set once the first SUBSCRIBE opened the connection
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._reader = asyncio.create_task(self._read_forever(), name="arbor-event-hub")

    async def stop(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        with anyio.move_on_after(self._timeout_s):
            await self._pubsub.aclose()

    @asynccontextmanager
    async def subscription(self, request_id: str) -> AsyncIterator[asyncio.Queue]:
        """A queue that receives the raw JSON of every event published for `request_id`."""
        channel = keys.events_channel(request_id)
        queue: asyncio.Queue = asyncio.Queue()
        confirmed = asyncio.get_running_loop().create_future()
        self._queues[channel] = queue
        self._confirmations[channel] = confirmed
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._commands:
                    await self._pubsub.subscribe(channel)
                self._connected.set()
                await confirmed
            yield queue
        finally:
            self._queues.pop(channel, None)
            self._confirmations.pop(channel, None)
            await self._unsubscribe(channel)

    async def _unsubscribe(self, channel: str) -> None:
        # Shielded: this runs while the request is being cancelled (client gone, shutdown).
        with anyio.CancelScope(shield=True), anyio.move_on_after(self._timeout_s):
            try:
                async with self._commands:
                    await self._pubsub.unsubscribe(channel)
            except (RedisError, OSError) as exc:
                log.warning("unsubscribe from %s failed: %s", channel, exc)

    async def _read_forever(self) -> None:
        await self._connected.wait()
        while True:
            try:
                message = await self._pubsub.get_message(timeout=READ_TIMEOUT_S)
            except (RedisError, OSError) as exc:
                log.warning("event hub read failed, retrying: %s", exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            except Exception:  # keep routing for everyone else; requests repair from the log
                log.exception("event hub read crashed, retrying")
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            if message is not None:
                self._dispatch(message)

    def _dispatch(self, message: dict) -> None:
        channel = message["channel"]
        if message["type"] == "message":
            queue = self._queues.get(channel)
            if queue is not None:
                queue.put_nowait(message["data"])
        elif message["type"] == "subscribe":
            confirmed = self._confirmations.get(channel)
            if confirmed is not None and not confirmed.done():
                confirmed.set_result(None)
