"""Notice a client is gone the moment it is, even while a handler is busy waiting.

A plain ASGI layer. It passes the request body through untouched; once the body is complete it
keeps calling `receive()` in a task of its own, because only that call reports
`http.disconnect`. It also bounds every `send()`: a client that stops reading (a full socket
buffer blocks uvicorn's send forever) is treated as gone after `send_timeout_s`, and what is
left of its reply is dropped. Handlers register listeners on the request's `DisconnectWatch`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

SCOPE_KEY = "arbor.disconnect"


class DisconnectWatch:
    __slots__ = ("_listeners", "disconnected")

    def __init__(self) -> None:
        self.disconnected = False
        self._listeners: list[Callable[[], None]] = []

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Called once, on disconnect (at once if the client is already gone). Must not block."""
        if self.disconnected:
            listener()
        else:
            self._listeners.append(listener)

    def fire(self) -> None:
        if not self.disconnected:
            self.disconnected = True
            for listener in self._listeners:
                listener()


def disconnect_watch(scope: Scope) -> DisconnectWatch:
    watch: DisconnectWatch = scope[SCOPE_KEY]  # put there by the middleware
    return watch


class DisconnectMiddleware:
    def __init__(self, app: ASGIApp, send_timeout_s: float) -> None:
        self.app = app
        self._send_timeout_s = send_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        watch = DisconnectWatch()
        scope[SCOPE_KEY] = watch
        relay = _Relay(receive, send, watch, self._send_timeout_s)
        try:
            await self.app(scope, relay.receive, relay.send)
        finally:
            await relay.close()


class _Relay:
    def __init__(self, receive: Receive, send: Send, watch: DisconnectWatch, send_timeout_s: float) -> None:
        self._receive = receive
        self._send = send
        self._watch = watch
        self._send_timeout_s = send_timeout_s
        self._stalled = False  # a send timed out: drop the rest of the reply
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._listener: asyncio.Task[None] | None = None  # owned here; cancelled in close()

    async def receive(self) -> Message:
        if self._listener is not None:
            return await self._inbox.get()
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self._watch.fire()
        elif not message.get("more_body", False):
            self._listener = asyncio.create_task(self._listen(), name="arbor-disconnect")
        return message

    async def send(self, message: Message) -> None:
        if self._stalled:
            return
        try:
            async with asyncio.timeout(self._send_timeout_s):
                await self._send(message)
        except TimeoutError:
            log.warning("client took no data for %.1f s; treating it as gone", self._send_timeout_s)
            self._stalled = True
            self._watch.fire()

    async def _listen(self) -> None:
        while True:
            message = await self._receive()
            self._inbox.put_nowait(message)
            if message["type"] == "http.disconnect":
                self._watch.fire()
                return

    async def close(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            await asyncio.gather(self._listener, return_exceptions=True)
