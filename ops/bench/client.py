"""Streaming chat clients against the gateway: one request's timings, and a level of N requests at C at once.

Timings are taken on the client, as a user sees them: TTFT = request sent -> first chunk with
text (the opening role chunk carries none); inter-token latency = gaps between text chunks (a
chunk carries several tokens when drafts are accepted); end = `data: [DONE]`, where the OpenAI SDK
stops reading (the rest of the response is still read, so the connection is reused);
TPOT = (end - first text) / (tokens - 1). Tokens are the usage chunk's `completion_tokens`
(stream_options.include_usage).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import httpx

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
            self.chunk_gaps_s.append(now - self.last_text_s)
        self.last_text_s = now

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.completion_tokens - 1)


def chat_body(model: str, prompt: str, max_tokens: int, temperature: float) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": temperature, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


async def stream_chat(client: httpx.AsyncClient, body: dict) -> RequestRecord:
    record = RequestRecord()
    started = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread()).decode()[:200]}"
                return record
            async for chunk in _sse_chunks(response):
                if chunk is DONE:
                    record.e2e_s = time.perf_counter() - started
                    continue
                if "error" in chunk:
                    record.error = f"stream error: {chunk['error'].get('message', chunk['error'])}"
                    return record
                if chunk.get("usage"):
                    record.completion_tokens = chunk["usage"]["completion_tokens"]
                if _has_text(chunk):
                    record.text_arrived(started)
        record.ok = record.completion_tokens > 0 and record.e2e_s > 0
        record.error = None if record.ok else "the stream ended without a usage chunk and [DONE]"
    except (httpx.HTTPError, json.JSONDecodeError) as error:
        record.error = f"{type(error).__name__}: {error}"
    finally:
        record.e2e_s = record.e2e_s or time.perf_counter() - started
    return record


DONE = {}  # stands for `data: [DONE]`


async def _sse_chunks(response: httpx.Response) -> AsyncIterator[dict]:
    """Each `data: {json}` event, parsed, and DONE for `data: [DONE]`. Split by hand from the raw
    bytes: the client shares the cores with what it measures, and httpx's line decoder costs more
    per chunk than the gateway's own framing."""
    buffer = b""
    async for data in response.aiter_bytes():
        buffer += data
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            if event.startswith(b"data: {"):
                yield json.loads(event[len(b"data: "):])
            elif event == b"data: [DONE]":
                yield DONE


def _has_text(chunk: dict) -> bool:
    return any(choice.get("delta", {}).get("content") or choice.get("delta", {}).get("reasoning_content")
               for choice in chunk.get("choices") or [])


async def run_level(base_url: str, bodies: Sequence[dict], concurrency: int, timeout_s: float,
                    request_timeout_s: float, on_done: Callable[[RequestRecord], None] = lambda _: None) -> dict:
    """Send every body, `concurrency` at a time (closed loop); the level stops after `timeout_s`."""
    records: list[RequestRecord] = []
    pending = iter(bodies)
    limits = httpx.Limits(max_connections=concurrency + 2, max_keepalive_connections=concurrency + 2)

    async def client_loop(client: httpx.AsyncClient) -> None:
        for body in pending:  # a shared iterator: each body goes to exactly one client
            records.append(await stream_chat(client, body))
            on_done(records[-1])

    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=base_url, timeout=request_timeout_s, limits=limits) as client:
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        except TimeoutError:
            records += [RequestRecord(error=f"level timed out after {timeout_s:.0f} s")
                        for _ in range(len(bodies) - len(records))]
    return summarize_level(concurrency, records, time.perf_counter() - started)


def summarize_level(concurrency: int, records: list[RequestRecord], duration_s: float) -> dict:
    ok = [record for record in records if record.ok]
    errors = [record.error for record in records if not record.ok]
    return {
        "concurrency": concurrency, "requests": len(records), "ok": len(ok), "errors": len(errors),
        "error_samples": sorted(set(filter(None, errors)))[:ERRORS_KEPT], "duration_s": round(duration_s, 3),
        "requests_per_s": ratio(len(ok), duration_s),
        "output_tokens_per_s": ratio(sum(record.completion_tokens for record in ok), duration_s),
        "ttft_ms": latency_ms([record.ttft_s for record in ok if record.ttft_s is not None]),
        "itl_ms": latency_ms([gap for record in ok for gap in record.chunk_gaps_s]),
        "tpot_ms": latency_ms([record.tpot_s for record in ok if record.tpot_s is not None]),
        "e2e_ms": latency_ms([record.e2e_s for record in ok]),
    }


def latency_ms(values_s: Sequence[float]) -> dict:
    p50, p99 = percentile(values_s, 50), percentile(values_s, 99)
    return {"p50": None if p50 is None else round(1000 * p50, 2), "p99": None if p99 is None else round(1000 * p99, 2),
            "n": len(values_s)}
