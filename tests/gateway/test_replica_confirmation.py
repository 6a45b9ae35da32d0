"""With ARBOR_REDIS_MIN_REPLICAS, a job is accepted only once a replica has it: an enqueue no
replica confirms is a 503 naming the setting, never a request a failover could silently lose.
A real master and replica (tests/support/sentinel_set.py's `ReplicatedPair`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest

from gateway import jobs
from shared import keys
from shared.openai_schema import ChatCompletionRequest
from shared.redis_connect import NoReplica, async_client
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer
from tests.support.sentinel_set import ReplicatedPair


@pytest.fixture
def pair() -> Iterator[ReplicatedPair]:
    with ReplicatedPair() as running:
        yield running


def job(number: int) -> jobs.Job:
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    return jobs.new_job("chat", request, 16, 60.0, lambda prefix: f"{prefix}-{number}")


def enqueue(url: str, number: int, min_replicas: int) -> str:
    async def main() -> str:
        client = async_client(url, 2.0, max_connections=4)
        try:
            queued = await jobs.enqueue(client, job(number), 100, min_replicas=min_replicas, wait_ms=300)
            return queued.entry_id
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_an_enqueue_is_confirmed_by_the_replica_which_then_holds_the_job(pair: ReplicatedPair) -> None:
    entry_id = enqueue(pair.url, 1, min_replicas=1)
    with pair.replica.client() as replica:
        assert [entry for entry, _ in replica.xrange(keys.request_stream(MODEL))] == [entry_id]


def test_an_enqueue_without_a_replica_raises_no_replica_unless_none_is_required(pair: ReplicatedPair) -> None:
    pair.stop_replica()
    with pytest.raises(NoReplica, match="0 of 1 replica"):
        enqueue(pair.url, 2, min_replicas=1)
    assert enqueue(pair.url, 3, min_replicas=0), "without the setting the master alone accepts it"
    pair.start_replica()
    assert enqueue(pair.url, 4, min_replicas=1)


def test_the_gateway_answers_503_redis_no_replica_and_cancels_the_job(pair: ReplicatedPair) -> None:
    peer = ProtocolPeer(pair.url, model=MODEL).start()  # a ready worker, so admission lets it through
    gateway = GatewayServer_for(pair.url)
    try:
        pair.stop_replica()
        response = gateway.http().post(
            "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert response.status_code == 503, response.text
        error = response.json()["error"]
        assert error["code"] == "redis_no_replica" and "ARBOR_REDIS_MIN_REPLICAS=1" in error["message"]
        with pair.master.client() as master:
            cancelled = wait_until(lambda: master.keys(keys.cancel_key("*")))
        assert len(cancelled) == 1, "the unconfirmed job is cancelled, so no worker runs it for nobody"
    finally:
        gateway.stop()
        peer.stop()


def GatewayServer_for(url: str) -> GatewayServer:  # noqa: N802  (reads as the class it makes)
    from shared.settings import GatewaySettings

    settings = GatewaySettings(redis_url=url, redis_min_replicas=1, redis_timeout_s=1.0, request_timeout_s=10.0)
    return GatewayServer(settings).start()


def wait_until(condition: Callable[[], list], timeout_s: float = 10.0) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    return []
