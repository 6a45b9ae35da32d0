"""Many requests at once share one pub/sub connection; each gets exactly its own events."""

from __future__ import annotations

import asyncio
import json

import httpx

from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import Pause, Step, delta, final

NUM_REQUESTS = 40


def _echo_id(job: Job) -> list[Step]:
    """Spells the request's own id back in three pieces, so any cross-talk shows."""
    tag = job.id[-6:]
    return [delta(tag[:2]), Pause(0.05), delta(tag[2:4]), delta(tag[4:]), final()]


async def _one(client: httpx.AsyncClient, i: int) -> tuple[str, str]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": str(i)}], "stream": i % 2 == 0}
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if not body["stream"]:
        reply = response.json()
        return reply["id"], reply["choices"][0]["message"]["content"]
    frames = [f.removeprefix("data: ") for f in response.text.split("\n\n") if f]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    return chunks[0]["id"], "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)


async def _all(base_url: str) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        return await asyncio.gather(*(_one(client, i) for i in range(NUM_REQUESTS)))


def test_concurrent_requests_do_not_cross_talk(make_gateway, make_peer) -> None:
    gateway: GatewayServer = make_gateway(max_queue=1000)
    peer = make_peer(script=_echo_id)

    results = asyncio.run(_all(gateway.base_url))

    assert len(peer.jobs) == NUM_REQUESTS
    assert all(text == request_id[-6:] for request_id, text in results), results
    assert len({request_id for request_id, _ in results}) == NUM_REQUESTS


def _slow_three(job: Job) -> list[Step]:
    return [delta("one "), Pause(0.6), delta("two "), Pause(0.6), delta("three"), final()]


def test_stream_survives_the_pubsub_connection_being_killed(gateway: GatewayServer, make_peer, redis_client) -> None:
    make_peer(script=_slow_three)
    texts = []

    with gateway.http().stream(
        "POST", "/v1/chat/completions", json={"model": MODEL, "messages": [], "stream": True} | _MESSAGES
    ) as response:
        for line in response.iter_lines():
            if '"one "' in line:
                assert redis_client.client_kill_filter(_type="pubsub") >= 1
            if line.startswith("data: {"):
                texts.append(json.loads(line.removeprefix("data: "))["choices"][0]["delta"].get("content", ""))

    assert "".join(texts) == "one two three"
    follow_up = gateway.openai().chat.completions.create(model=MODEL, **_MESSAGES)  # the hub reconnected
    assert follow_up.choices[0].message.content == "one two three"


_MESSAGES = {"messages": [{"role": "user", "content": "count"}]}
