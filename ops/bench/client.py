"""Streaming chat clients against the gateway: one request's timings, and a level of N requests at C at once.

Timings are taken on the client, as a user sees them: TTFT = request sent -> first chunk with
text (the opening role chunk carries none); inter-token latency = gaps between text chunks (a
chunk carries several tokens when drafts are accepted); end = `data: [DONE]`, where the OpenAI SDK
stops reading (the rest of the response is still read, so the connection is reused);
TPOT = (end - first text) / (tokens - 1). Tokens are the usage chunk's `completion_tokens`
(stream_options.include_usage).

The client is HTTP/1.1 over asyncio streams (`SseClient`), connections kept alive and reused,
not httpx: it shares the cores with what it measures, and on the tiny model httpx's per-chunk
machinery cost ~0.3 ms of CPU per token, as much as the gateway's own work for that token.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from ops.bench.api_shapes import PATHS, read_event, request_body
from ops.bench.results import percentile, ratio

ERRORS_KEPT = 5  # error messages kept per level in the report


@dataclass(slots=True)
class RequestRecord:
    ok: bool = False
    ttft_s: float | None = None
    e2e_s: float = 0.0
    completion_tokens: int = 0
    chunk_gaps_s: list[float] = field(default_factory=list)
    error: str | None = None
    last_text_s: float | None = None  # perf_counter of the latest text chunk

    def text_arrived(self, started: float) -> None:
        """A text chunk just arrived: the first sets TTFT, later ones add an inter-chunk gap."""
        now = time.perf_counter()
        if self.ttft_s is None:
            self.ttft_s = now - started
        else:
            assert self.last_text_s is not None  # set with ttft_s, by the first chunk
            self.chunk_gaps_s.append(now - self.last_text_s)
        self.last_text_s = now

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


def chat_body(model: str, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool = True) -> dict:
    """`ignore_eos` is no OpenAI field, but Arbor, vLLM and llama-server take it: every request runs to max_tokens."""
    return request_body("chat", model, prompt, max_tokens, temperature, ignore_eos)


class HttpError(Exception):
    """The server's reply was not HTTP/1.1 as expected."""


@dataclass(slots=True)
class StreamedResponse:
    status: int
    _reader: asyncio.StreamReader
    _chunked: bool
    _length: int  # -1: to the end of the connection
    complete: bool = False  # the whole body was read: the connection can be reused

    async def body(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked: chunk by chunk)."""
        if not self._chunked and self._length < 0:  # delimited by the server closing: not reusable
            while data := await self._reader.read(65536):
                yield data
            return
        if not self._chunked:
            data = await self._reader.readexactly(self._length)
            self.complete = True
            if data:
                yield data
            return
        while True:
            size_line = await self._reader.readuntil(b"\r\n")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while await self._reader.readuntil(b"\r\n") != b"\r\n":  # trailers, if any
                    pass
                self.complete = True
                return
            yield (await self._reader.readexactly(size + 2))[:-2]

    async def read(self) -> bytes:
        return b"".join([data async for data in self.body()])


class SseClient:
    """POST a JSON body, read the streamed reply; idle connections are kept and reused.

    Only while the server surely still keeps them: uvicorn closes a connection idle for 5 s (its
    `timeout_keep_alive`), and a request written to a connection it is closing is lost. So a
    connection idle longer than `keep_alive_s` is closed rather than reused (in `bench serving`'s
    comparison, in-process requests block the loop for seconds between two gateway requests)."""

    def __init__(self, base_url: str, timeout_s: float, keep_alive_s: float = 2.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        self._host, self._port = url.hostname or "127.0.0.1", url.port or 80
        self.timeout_s = timeout_s
        self.keep_alive_s = keep_alive_s
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []  # + idle since

    @asynccontextmanager
    async def post(self, path: str, body: dict) -> AsyncIterator[StreamedResponse]:
        payload = json.dumps(body).encode()
        request = (
            f"POST {path} HTTP/1.1\r\nHost: {self._host}:{self._port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        reader, writer, reused = await self._connection()
        response = None
        try:
            writer.write(request)
            try:
                response = await _read_head(reader)
            except asyncio.IncompleteReadError as error:
                # A kept connection the server closed after its last reply (llama-server does, with
                # no `Connection: close`): nothing was read, so send again on a fresh one, once,
                # as HTTP clients do for a stale keep-alive connection.
                if not reused or error.partial:
                    raise
                writer.close()
                reader, writer = await asyncio.open_connection(self._host, self._port)
                writer.write(request)
                response = await _read_head(reader)
            yield response
        finally:
            if response is not None and response.complete:
                self._idle.append((reader, writer, time.monotonic()))
            else:
                writer.close()

    async def _connection(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A connection, and whether it is a kept one."""
        while self._idle:
            reader, writer, since = self._idle.pop()
            if time.monotonic() - since < self.keep_alive_s and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return reader, writer, False

    async def aclose(self) -> None:
        for _, writer, _ in self._idle:
            writer.close()
        self._idle.clear()


async def _read_head(reader: asyncio.StreamReader) -> StreamedResponse:
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise HttpError(f"not an HTTP/1.x status line: {head[0]!r}")
    fields = (line.partition(":") for line in head[1:] if line)
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    chunked = "chunked" in headers.get("transfer-encoding", "").lower()
    length = int(headers.get("content-length", -1))  # neither header: the body ends when the server closes
    return StreamedResponse(int(parts[1]), reader, chunked, length)


async def stream_chat(client: SseClient, body: dict, api: str = "chat") -> RequestRecord:
    """One streamed request in `api`'s shape (api_shapes.py), timed."""
    record = RequestRecord()
    started = time.perf_counter()
    try:
        async with asyncio.timeout(client.timeout_s), client.post(PATHS[api], body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.read()).decode()[:200]}"
                return record
            async for data in sse_events(response.body()):
                event = read_event(api, None if data is DONE else data)
                if event.error is not None:
                    record.error = f"stream error: {event.error}"
                    return record
                if event.completion_tokens is not None:
                    record.completion_tokens = event.completion_tokens
                if event.has_text:
                    record.text_arrived(started)
                if event.done:
                    record.e2e_s = time.perf_counter() - started
        record.ok = record.completion_tokens > 0 and record.e2e_s > 0
        record.error = None if record.ok else "the stream ended without its usage and its end"
    except (OSError, EOFError, TimeoutError, HttpError, ValueError) as error:  # JSON errors are ValueErrors
        record.error = f"{type(error).__name__}: {error}"
    finally:
        record.e2e_s = record.e2e_s or time.perf_counter() - started
    return record


DONE: dict[str, Any] = {}  # stands for `data: [DONE]`


async def sse_events(body: AsyncIterator[bytes]) -> AsyncIterator[dict]:
    """Each event's `data: {json}`, parsed, and DONE for `data: [DONE]`; an `event:` line may come
    first (Anthropic's), and the space after `data:` and CRLF line ends are optional in SSE."""
    buffer = b""
    async for data in body:
        buffer = (buffer + data).replace(b"\r\n", b"\n")  # a CR may end one read, its LF start the next
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # a comment or another field
                data_line = line[len(b"data:") :].lstrip(b" ")
                if data_line.startswith(b"{"):
                    yield json.loads(data_line)
                elif data_line == b"[DONE]":
                    yield DONE


async def run_level(
    base_url: str,
    bodies: Sequence[dict],
    concurrency: int,
    timeout_s: float,
    request_timeout_s: float,
    on_done: Callable[[RequestRecord], None] = lambda _: None,
    api: str = "chat",
) -> dict:
    """Send every body, `concurrency` at a time (closed loop); the level stops after `timeout_s`."""
    records: list[RequestRecord] = []
    pending = iter(bodies)
    client = SseClient(base_url, request_timeout_s)

    async def client_loop() -> None:
        for body in pending:  # a shared iterator: each body goes to exactly one client
            records.append(await stream_chat(client, body, api))
            on_done(records[-1])

    started = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s):
            await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    except TimeoutError:
        records += [
            RequestRecord(error=f"level timed out after {timeout_s:.0f} s") for _ in range(len(bodies) - len(records))
        ]
    finally:
        await client.aclose()
    return summarize_level(concurrency, records, time.perf_counter() - started)


def summarize_level(concurrency: int, records: list[RequestRecord], duration_s: float) -> dict:
    ok = [record for record in records if record.ok]
    errors = [record.error for record in records if not record.ok]
    return {
        "concurrency": concurrency,
        "requests": len(records),
        "ok": len(ok),
        "errors": len(errors),
        "error_samples": sorted(set(filter(None, errors)))[:ERRORS_KEPT],
        "duration_s": round(duration_s, 3),
        "requests_per_s": ratio(len(ok), duration_s),
        "output_tokens_per_s": ratio(sum(record.completion_tokens for record in ok), duration_s),
        "ttft_ms": latency_ms([record.ttft_s for record in ok if record.ttft_s is not None]),
        "itl_ms": latency_ms([gap for record in ok for gap in record.chunk_gaps_s]),
        "tpot_ms": latency_ms([record.tpot_s for record in ok if record.tpot_s is not None]),
        "e2e_ms": latency_ms([record.e2e_s for record in ok]),
    }


def latency_ms(values_s: Sequence[float]) -> dict:
    p50, p99 = percentile(values_s, 50), percentile(values_s, 99)
    return {
        "p50": None if p50 is None else round(1000 * p50, 2),
        "p99": None if p99 is None else round(1000 * p99, 2),
        "n": len(values_s),
    }
