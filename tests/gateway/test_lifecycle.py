"""How a request ends when it does not end well: client gone, deadline passed, worker error."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest
import redis
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import keys
from shared.protocol import Job, parse_control
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import Pause, ProtocolPeer, Step, WaitForCancel, delta, error

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def control(redis_client: redis.Redis) -> Iterator[redis.client.PubSub]:
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.CONTROL_CHANNEL)
    yield pubsub
    pubsub.close()


def _cancels(pubsub: redis.client.PubSub, timeout_s: float = 5.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None:
            return [parse_control(message["data"]).id]
    return []


def _first_then_wait(job: Job) -> list[Step]:
    return [delta("first"), WaitForCancel(timeout_s=10)]


def test_disconnect_mid_stream_cancels_the_job(
    gateway: GatewayServer, make_peer, redis_client: redis.Redis, control
) -> None:
    peer = make_peer(script=_first_then_wait)

    with gateway.http().stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as response:
        lines = response.iter_lines()
        seen = [next(lines) for _ in range(4)]  # role chunk, blank, first delta, blank
        # leaving the block closes the connection mid-stream

    assert '"first"' in seen[2]
    request_id = json.loads(seen[0].removeprefix("data: "))["id"]
    assert _cancels(control) == [request_id]
    assert redis_client.exists(keys.cancel_key(request_id))
    assert 0 < redis_client.ttl(keys.cancel_key(request_id)) <= 600
    _wait_for(lambda: peer.cancelled == [request_id])


def test_disconnect_mid_stream_cancels_every_job_of_a_batch(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_first_then_wait)
    body = {"model": MODEL, "prompt": ["a", "b", "c"], "stream": True}

    with gateway.http().stream("POST", "/v1/completions", json=body) as response:
        lines = response.iter_lines()
        assert '"first"' in next(lines)  # one prompt's first delta; leaving the block hangs up

    _wait_for(lambda: len(peer.jobs) == 3 and sorted(peer.cancelled) == sorted(job.id for job in peer.jobs))


def test_disconnect_while_waiting_non_streaming_cancels_the_job(
    gateway: GatewayServer, make_peer, redis_client: redis.Redis, control
) -> None:
    peer = make_peer(script=_first_then_wait)

    with pytest.raises(httpx.ReadTimeout):
        gateway.http().post("/v1/chat/completions", json=CHAT, timeout=httpx.Timeout(5, read=0.5))

    [job] = peer.jobs
    assert _cancels(control) == [job.id]
    assert redis_client.exists(keys.cancel_key(job.id))
    _wait_for(lambda: peer.cancelled == [job.id])


def _headers_fail(app: ASGIApp) -> ASGIApp:
    """The app behind a connection that breaks as the response's headers go out."""

    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        async def send_or_fail(message: Message) -> None:
            if message["type"] == "http.response.start":
                raise OSError("connection reset")
            await send(message)

        await app(scope, receive, send_or_fail if scope["type"] == "http" else send)

    return wrapped


def test_a_stream_that_cannot_send_its_headers_cancels_its_job(
    make_gateway, make_peer, redis_client: redis.Redis, control
) -> None:
    """The job is enqueued before the response starts, so a response that never sends a byte (and
    never starts its body) must still cancel it and let go of its subscription."""
    gateway = make_gateway(wrap_app=_headers_fail)
    peer = make_peer(script=_first_then_wait)

    with pytest.raises(httpx.HTTPError):  # the broken connection: uvicorn drops it, or answers 500
        gateway.http().post("/v1/chat/completions", json=CHAT | {"stream": True}).raise_for_status()

    _wait_for(lambda: len(peer.jobs) == 1)
    [job] = peer.jobs
    assert _cancels(control) == [job.id]
    _wait_for(lambda: peer.cancelled == [job.id])


def test_finished_requests_are_not_cancelled(gateway: GatewayServer, peer: ProtocolPeer, control) -> None:
    gateway.openai().chat.completions.create(**CHAT)
    list(gateway.openai().chat.completions.create(**CHAT, stream=True))

    assert _cancels(control, timeout_s=0.5) == []


def _stall(job: Job) -> list[Step]:
    return [delta("slow"), Pause(2.5)]


def test_deadline_ends_a_stream_with_a_timeout_error(make_gateway, make_peer, redis_client, control) -> None:
    gateway = make_gateway(request_timeout_s=1.0)
    make_peer(script=_stall)

    with gateway.http().stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as response:
        frames = response.read().decode().split("\n\n")[:-1]

    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2].removeprefix("data: "))["error"]["code"] == "timeout"
    request_id = json.loads(frames[0].removeprefix("data: "))["id"]
    assert _cancels(control) == [request_id]


def test_deadline_without_streaming_is_504(make_gateway, make_peer) -> None:
    gateway = make_gateway(request_timeout_s=1.0)
    make_peer(script=_stall)

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"


@pytest.mark.parametrize(
    ("code", "status"), [("context_length_exceeded", 400), ("internal_error", 500), ("dead_letter", 500)]
)
def test_worker_errors_map_to_http_statuses(gateway: GatewayServer, make_peer, code: str, status: int) -> None:
    make_peer(script=lambda job: [error(f"worker says {code}", code)])

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == status
    assert response.json()["error"] == {
        "message": f"worker says {code}",
        "type": "invalid_request_error" if status == 400 else "server_error",
        "param": None,
        "code": code,
    }


def test_malformed_worker_event_is_a_500_not_a_hang(gateway: GatewayServer, make_peer, redis_client) -> None:
    make_peer(script=_garbage_script(redis_client))

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    assert response.status_code == 500
    assert "invalid event" in response.json()["error"]["message"]


def _garbage_script(client: redis.Redis):
    """Writes an event of an unknown type where the request's events go."""

    def script(job: Job) -> list[Step]:
        client.rpush(keys.event_log(job.id), '{"id": "x", "seq": 0, "type": "smile"}')
        client.publish(keys.events_channel(job.id), '{"id": "x", "seq": 0, "type": "smile"}')
        return []

    return script


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)
