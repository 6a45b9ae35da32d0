"""Counts every HTTP response by route and status (`arbor_http_requests_total`)."""

from __future__ import annotations

from prometheus_client import Counter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

KNOWN_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/openapi.json", "/v1/responses"}
)
MODEL_ROUTE = "/v1/models/{model}"
RESPONSE_ROUTE = "/v1/responses/{response_id}"


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
            route = _route(scope["path"])
            self._counter.labels(route=route, status=str(status)).inc()


def _route(path: str) -> str:
    """The label for a path: a known route, its template (one label for every model id), or
    "other", so that clients cannot mint labels."""
    if path in KNOWN_ROUTES:
        return path
    if path.startswith("/v1/responses/"):
        return RESPONSE_ROUTE
    return MODEL_ROUTE if path.startswith("/v1/models/") else "other"
