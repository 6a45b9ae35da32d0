"""Admission: 503 without a ready worker, 429 with Retry-After when the model's queue is full."""

from __future__ import annotations

import asyncio
import json
import time

import redis
import redis.asyncio

from gateway.admission import FLEET_FRESH_S, Admission
from gateway.errors import ApiError
from gateway.jobs import QueueFull, enqueue
from shared import keys
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.support.redis_server import RedisServer

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def _enqueue_jobs(client: redis.Redis, count: int) -> None:
    for i in range(count):
        now = time.time()
        body = json.dumps(CHAT | {"max_tokens": 4})
        job = Job(id=f"chatcmpl-old{i}", model=MODEL, kind="chat", body=body, created=now, deadline=now + 60)
        client.xadd(keys.request_stream(MODEL), job.to_fields())


def test_no_workers_at_all_is_503(gateway: GatewayServer) -> None:
    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_ready_worker"


def test_worker_not_ready_is_503(gateway: GatewayServer, make_peer) -> None:
    make_peer(ready=False)

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_ready_worker"


def test_expired_heartbeat_no_longer_counts(gateway: GatewayServer, redis_client: redis.Redis, make_peer) -> None:
    peer = make_peer()
    peer.stop()
    redis_client.delete(keys.worker_heartbeat(peer.worker_id))  # what the TTL does

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 503


def test_full_queue_is_429_with_retry_after(make_gateway, redis_client: redis.Redis, make_peer) -> None:
    gateway = make_gateway(max_queue=3, retry_after_s=7)
    make_peer(consume=False)
    _enqueue_jobs(redis_client, 3)

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 429
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "queue_full"
    assert redis_client.xlen(keys.request_stream(MODEL)) == 3  # nothing trimmed, nothing added
    assert redis_client.keys(keys.cancel_key("*")) == [], "a refused job was never queued: nothing to cancel"


def test_pending_jobs_count_towards_the_limit(make_gateway, redis_client: redis.Redis, make_peer) -> None:
    gateway = make_gateway(max_queue=2)
    make_peer(consume=False)
    _enqueue_jobs(redis_client, 2)
    redis_client.xreadgroup(keys.CONSUMER_GROUP, "someone", {keys.request_stream(MODEL): ">"}, count=1)

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 429


def test_room_in_the_queue_is_admitted(make_gateway, redis_client: redis.Redis, make_peer) -> None:
    gateway = make_gateway(max_queue=3)
    make_peer()
    _enqueue_jobs(redis_client, 1)

    reply = gateway.openai().chat.completions.create(**CHAT)

    assert reply.choices[0].finish_reason == "stop"


def test_the_queue_limit_holds_when_requests_race_for_the_last_places(
    redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    """The limit is checked in the script that adds the job, so racing requests cannot all see room."""

    async def race() -> list[str | int]:
        client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
        try:

            async def one(i: int) -> str | int:
                now = time.time()
                job = Job(id=f"chatcmpl-race{i}", model=MODEL, kind="chat", body="{}", created=now, deadline=now + 60)
                try:
                    return (await enqueue(client, job, max_queue=5)).entry_id
                except QueueFull as full:
                    return full.length

            return await asyncio.gather(*(one(i) for i in range(20)))
        finally:
            await client.aclose()

    outcomes = asyncio.run(race())

    assert sum(isinstance(outcome, str) for outcome in outcomes) == 5
    assert sorted(outcome for outcome in outcomes if isinstance(outcome, int)) == [5] * 15


def test_a_fleet_that_could_serve_is_trusted_briefly_and_a_refusal_never(
    redis_server: RedisServer, redis_client: redis.Redis, make_peer
) -> None:
    now = [0.0]

    async def admitted(admission: Admission) -> bool:
        try:
            await admission.admit(MODEL)
        except ApiError as refused:
            assert refused.code == "no_ready_worker"
            return False
        return True

    async def scenario() -> list[bool]:
        client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
        admission = Admission(client, clock=lambda: now[0])
        try:
            seen = [await admitted(admission)]  # no worker yet
            peer = make_peer()
            seen.append(await admitted(admission))  # a refusal is not remembered: read again, ready
            peer.stop()
            redis_client.delete(keys.worker_heartbeat(peer.worker_id))  # what the TTL does
            seen.append(await admitted(admission))  # within FLEET_FRESH_S: not read again
            now[0] += FLEET_FRESH_S
            seen.append(await admitted(admission))  # read again: gone
            return seen
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == [False, True, True, False]
