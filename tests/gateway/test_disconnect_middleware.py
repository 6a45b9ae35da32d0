"""The disconnect layer on its own: a disconnect is seen while the app waits, a stalled send ends."""

from __future__ import annotations

import asyncio

from gateway.middleware.disconnect import DisconnectMiddleware, disconnect_watch

SCOPE = {"type": "http", "path": "/", "method": "POST", "headers": []}


async def _waits_for_disconnect(scope, receive, send) -> None:
    body = await receive()
    assert body["type"] == "http.request"
    gone = asyncio.Event()
    disconnect_watch(scope).add_listener(gone.set)
    await asyncio.wait_for(gone.wait(), 2)  # the app never calls receive() again
    scope["seen"] = True


def test_disconnect_is_seen_while_the_app_waits() -> None:
    async def run() -> dict:
        inbox: asyncio.Queue = asyncio.Queue()
        inbox.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})
        scope = dict(SCOPE)
        app = DisconnectMiddleware(_waits_for_disconnect, send_timeout_s=5)
        task = asyncio.create_task(app(scope, inbox.get, _discard))
        await asyncio.sleep(0.05)
        inbox.put_nowait({"type": "http.disconnect"})
        await asyncio.wait_for(task, 2)
        return scope

    assert asyncio.run(run())["seen"] is True


async def _discard(message) -> None:
    return None


def test_a_client_that_stops_reading_counts_as_gone() -> None:
    sent: list[dict] = []
    fired: list[bool] = []

    async def stalls_after_headers(message) -> None:
        if message["type"] == "http.response.body":
            await asyncio.sleep(3600)  # a full socket buffer
        sent.append(message)

    async def streams(scope, receive, send) -> None:
        await receive()
        disconnect_watch(scope).add_listener(lambda: fired.append(True))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def run() -> None:
        inbox: asyncio.Queue = asyncio.Queue()
        inbox.put_nowait({"type": "http.request", "body": b"", "more_body": False})
        app = DisconnectMiddleware(streams, send_timeout_s=0.1)
        await asyncio.wait_for(app(dict(SCOPE), inbox.get, stalls_after_headers), 2)

    asyncio.run(run())

    assert [m["type"] for m in sent] == ["http.response.start"]
    assert fired == [True]
