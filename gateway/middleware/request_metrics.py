"""Counts every HTTP response by route and status (`arbor_http_requests_total`)."""

from __future__ import annotations

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/openapi.json"}
)


class RequestMetricsMiddleware:
    def __init__(self, app: ASGIApp, http_requests: Counter) -> None:
        self.app = app
        self._counter = http_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # if the app dies before it responds

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = scope["path"] if scope["path"] in KNOWN_ROUTES else "other"
            self._counter.labels(route=route, status=str(status)).inc()
