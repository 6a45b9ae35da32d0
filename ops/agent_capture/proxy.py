"""A logging reverse proxy: forwards every request to the gateway, streams the answer back
unchanged, and writes one JSON record per exchange into a folder.

    agent CLI -> proxy (127.0.0.1:P) -> gateway -> ...
                   `-> <log_dir>/NN-<route>.json: method, path, headers (secrets dropped), JSON
                       body, the answer's status, its SSE event names in order, an error's body

It exists so that recorded traffic of real clients, not hand-written shapes, becomes the test
fixtures (tests/fixtures/agent_traffic/), and so that a CLI's end-to-end run can assert that
nothing it sent was answered 4xx/5xx.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from ops.agent_capture.sse_names import MAX_ERROR_CHARS, SseNames, squeeze

SECRET_HEADER_WORDS = ("authorization", "key", "token", "secret", "cookie")
# per-connection or recomputed on the way: not part of what a client chose to send
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}
UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=900.0, write=60.0, pool=10.0)


@dataclass
class Exchange:
    """One request and what its answer looked like."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0
    events: list[str] = field(default_factory=list)
    error: str | None = None

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"method": self.method, "path": self.path, "headers": self.headers}
        record |= {"body": self.body, "status": self.status, "events": squeeze(self.events)}
        return record | ({"error": self.error} if self.error is not None else {})


class ExchangeLog:
    """Numbers exchanges in arrival order and writes each when its answer has ended."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()

    def next_name(self, path: str) -> str:
        with self._lock:
            number = next(self._numbers)
        return f"{number:02d}-{route_name(path)}.json"

    def write(self, name: str, exchange: Exchange) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        (self.log_dir / name).write_text(json.dumps(exchange.record(), indent=1, ensure_ascii=False) + "\n")


def route_name(path: str) -> str:
    """`/v1/chat/completions` -> `chat-completions`, `/v1/messages/count_tokens` -> `messages-count_tokens`."""
    parts = [part for part in path.split("?")[0].strip("/").split("/") if part]
    if parts and parts[0] == "v1":
        parts = parts[1:]
    return "-".join(parts) or "root"


def logged_headers(headers: dict[str, str]) -> dict[str, str]:
    return {
        name: value
        for name, value in sorted(headers.items())
        if name not in HOP_HEADERS and not any(word in name for word in SECRET_HEADER_WORDS)
    }


def forwarded_headers(headers: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name not in HOP_HEADERS}


def parse_body(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def create_proxy_app(upstream_url: str, log_dir: Path, transport: httpx.AsyncBaseTransport | None = None) -> Starlette:
    """`transport`: how to reach the upstream, when not over the network (tests)."""
    log = ExchangeLog(log_dir)
    client = httpx.AsyncClient(base_url=upstream_url, timeout=UPSTREAM_TIMEOUT, transport=transport)

    async def forward(request: Request) -> StreamingResponse:
        raw = await request.body()
        headers = dict(request.headers)
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        exchange = Exchange(request.method, path, logged_headers(headers), parse_body(raw))
        upstream_request = client.build_request(request.method, path, headers=forwarded_headers(headers), content=raw)
        upstream = await client.send(upstream_request, stream=True)
        exchange.status = upstream.status_code
        name = log.next_name(request.url.path)
        response_headers = {k: v for k, v in upstream.headers.items() if k not in HOP_HEADERS | {"content-encoding"}}
        return StreamingResponse(_relay(upstream, log, name, exchange), upstream.status_code, response_headers)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with client:
            yield

    route = Route("/{path:path}", forward, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
    return Starlette(routes=[route], lifespan=lifespan)


async def _relay(upstream: httpx.Response, log: ExchangeLog, name: str, exchange: Exchange) -> AsyncIterator[bytes]:
    """The answer's bytes as they come; the record is written however the stream ends (a client
    that hangs up mid-answer included: the generator is closed, `finally` runs)."""
    sse = SseNames() if "text/event-stream" in upstream.headers.get("content-type", "") else None
    errors = bytearray()
    try:
        async for chunk in upstream.aiter_raw():
            if sse is not None:
                sse.feed(chunk)
                exchange.events = sse.names
                exchange.error = "\n".join(sse.errors) or None
            if exchange.status >= 400 and len(errors) < MAX_ERROR_CHARS:
                errors += chunk
            yield chunk
    finally:
        await upstream.aclose()
        if errors:
            exchange.error = errors[:MAX_ERROR_CHARS].decode("utf-8", "replace")
        log.write(name, exchange)


def serve_proxy(upstream_url: str, log_dir: Path, port: int, host: str = "127.0.0.1") -> None:
    import uvicorn

    uvicorn.run(create_proxy_app(upstream_url, log_dir), host=host, port=port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.agent_capture.proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="the gateway, e.g. http://127.0.0.1:8000")
    parser.add_argument("--log-dir", type=Path, required=True, help="one JSON record per exchange goes here")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve_proxy(args.upstream, args.log_dir, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
