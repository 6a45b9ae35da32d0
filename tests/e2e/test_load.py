"""64 concurrent streaming clients against the live stack for a bounded time, through the OpenAI SDK.

Every response must be exactly the greedy answer for its prompt — the scripted model's script, or
the tiny model's non-streamed answer to the same request taken before the load — with one finish
reason and the same usage: a lost, repeated or crossed token changes the text. Zero errors.
Afterwards every lane is free, and the gateway's and workers' resident memory grew by less than
`MAX_RSS_GROWTH_BYTES` since the end of a warm-up round.

    ARBOR_LOAD_SECONDS=120 .venv/bin/pytest -q tests/e2e/test_load.py   # the full run (make test-hardening)

The default run loads for 20 s.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import httpx
import openai
import pytest

from tests.e2e.live_stack import SCRIPTED_MODEL, TINY_MODEL, Stack
from tests.support.processes import rss_bytes
from tests.support.scripted_model import PLAIN

LOAD_SECONDS = float(os.environ.get("ARBOR_LOAD_SECONDS", "20"))
NUM_CLIENTS = 64
TINY_MAX_TOKENS = 24
REQUEST_TIMEOUT_S = 120.0  # hang detection only: 64 clients share a few lanes on two busy cores
# Measured growth after the warm-up is ~1-2 MB (allocator noise; the prompt set is fixed, so the
# prefill cache is full after the warm-up). At ~40 requests/s through the gateway, 32 MB catches a
# leak of ~40 KB per request in the 20 s run (a stuck task or a stream's whole event list) and of
# ~7 KB per request in the 120 s run.
MAX_RSS_GROWTH_BYTES = 32 * 2**20
TINY_PROMPTS = [
    "Tell me about foxes.",
    "Count to ten.",
    "What is speculative decoding?",
    "Write a haiku about Redis.",
    "def add(a, b):",
    "List three fruits.",
    "How are you today?",
    "Explain streams and consumer groups.",
]


@dataclass(frozen=True)
class Expected:
    text: str
    completion_tokens: int


@dataclass
class Tally:
    num_requests: int = 0
    errors: list[str] = field(default_factory=list)


def _request(client_index: int, round_index: int) -> dict:
    if client_index % 4 == 0:
        return {"model": SCRIPTED_MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    prompt = TINY_PROMPTS[(client_index + round_index) % len(TINY_PROMPTS)]
    return {
        "model": TINY_MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": TINY_MAX_TOKENS,
        "extra_body": {"ignore_eos": True},
    }


def _key(request: dict) -> tuple[str, str]:
    return request["model"], request["messages"][0]["content"]


def _expected_answers(stack: Stack) -> dict[tuple[str, str], Expected]:
    client = stack.openai(timeout_s=REQUEST_TIMEOUT_S)
    requests = [_request(0, 0)] + [_request(1, i) for i in range(len(TINY_PROMPTS))]
    expected = {}
    for request in requests:
        reply = client.chat.completions.create(temperature=0, **request)
        expected[_key(request)] = Expected(reply.choices[0].message.content, reply.usage.completion_tokens)
    assert expected[_key(_request(0, 0))].text == PLAIN.text
    return expected


async def _stream_once(client: openai.AsyncOpenAI, request: dict, expected: Expected) -> str | None:
    """None if the streamed answer is exactly the expected one, else what went wrong."""
    stream = await client.chat.completions.create(
        temperature=0, stream=True, stream_options={"include_usage": True}, **request
    )
    text, finish_reasons, usage = "", [], None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.finish_reason is not None:
                finish_reasons.append(choice.finish_reason)
        usage = chunk.usage or usage
    if text != expected.text:
        return f"{_key(request)}: got {text!r}, expected {expected.text!r}"
    if len(finish_reasons) != 1 or usage is None or usage.completion_tokens != expected.completion_tokens:
        return f"{_key(request)}: finish reasons {finish_reasons}, usage {usage}"
    return None


async def _client_loop(
    index: int, client: openai.AsyncOpenAI, expected: dict, until: float | None, tally: Tally
) -> None:
    """Requests back to back until `until` (loop time), or exactly one when `until` is None."""
    loop = asyncio.get_running_loop()
    round_index = 0
    while True:
        request = _request(index, round_index)
        try:
            problem = await _stream_once(client, request, expected[_key(request)])
        except (openai.OpenAIError, httpx.HTTPError) as error:
            problem = f"{_key(request)}: {type(error).__name__}: {error}"
        tally.num_requests += 1
        if problem is not None:
            tally.errors.append(problem)
        round_index += 1
        if until is None or loop.time() >= until:
            return


async def _load(stack: Stack, expected: dict, duration_s: float | None) -> Tally:
    tally = Tally()
    client = openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key="x", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    async with client:
        until = None if duration_s is None else asyncio.get_running_loop().time() + duration_s
        await asyncio.gather(*(_client_loop(i, client, expected, until, tally) for i in range(NUM_CLIENTS)))
    return tally


def _lanes_busy(http: httpx.Client) -> int:
    return sum(worker["lanes_busy"] for worker in http.get("/health").json()["workers"])


@pytest.mark.timeout(LOAD_SECONDS + 600)
def test_64_streaming_clients_get_exact_answers_with_bounded_memory(stack: Stack) -> None:
    expected = _expected_answers(stack)
    warm_up = asyncio.run(_load(stack, expected, duration_s=None))  # one request per client
    assert warm_up.errors == [], warm_up.errors[:5]
    pids = stack.process_ids()
    rss_before = {name: rss_bytes(pid) for name, pid in pids.items()}

    tally = asyncio.run(_load(stack, expected, duration_s=LOAD_SECONDS))

    rss_after = {name: rss_bytes(pid) for name, pid in pids.items()}
    assert tally.errors == [], f"{len(tally.errors)} of {tally.num_requests} failed: {tally.errors[:5]}"
    assert tally.num_requests >= NUM_CLIENTS
    growth = {name: rss_after[name] - rss_before[name] for name in pids}
    print(
        f"\n{tally.num_requests} requests in {LOAD_SECONDS:g} s; RSS growth (MB): "
        + ", ".join(f"{name} {delta / 2**20:+.1f}" for name, delta in growth.items())
    )
    assert all(delta < MAX_RSS_GROWTH_BYTES for delta in growth.values()), growth
    http = stack.http()
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    while _lanes_busy(http) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _lanes_busy(http) == 0
    assert http.get("/health").status_code == 200
