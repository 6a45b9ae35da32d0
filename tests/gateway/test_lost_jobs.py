"""A job that Redis lost (a restart without persistence, a flush) ends its request with an error at
once instead of holding the client until the request deadline; a job that is merely waiting is not lost.

Workers delete a job's stream entry only after publishing its last event, so the gateway may call
a job lost when, after a silence, the entry is gone and the event log holds nothing new.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import redis

from shared import keys
from shared.protocol import Job
from tests.gateway.conftest import MODEL
from tests.gateway.protocol_peer import Step, delta

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
DEADLINE_S = 120.0  # far beyond the client's timeout (20 s): reaching it would fail the test


def _once_queued(redis_client: redis.Redis, delay_s: float, action: Callable[[], object]) -> threading.Thread:
    """Runs `action` in a thread `delay_s` after the job shows up in the stream."""

    def run() -> None:
        deadline = time.monotonic() + 10
        while not redis_client.xlen(keys.request_stream(MODEL)) and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(delay_s)
        action()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_queued_job_lost_from_redis_is_503_job_lost(make_gateway, make_peer, redis_client: redis.Redis) -> None:
    gateway = make_gateway(request_timeout_s=DEADLINE_S)
    make_peer(consume=False)  # a ready worker that never reads: the job waits in the stream
    # Deleting the stream takes the entry and the group with it, as an empty new Redis would.
    lose = _once_queued(redis_client, 0.5, lambda: redis_client.delete(keys.request_stream(MODEL)))

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    lose.join()
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "job_lost"


def _lost_after_a_delta(job: Job) -> list[Step]:
    return [delta("Hel", token_ids=[1])]  # then the entry is deleted with no final: the job is lost


def test_a_running_job_lost_mid_stream_ends_with_an_error_event(make_gateway, make_peer) -> None:
    gateway = make_gateway(request_timeout_s=DEADLINE_S)
    make_peer(script=_lost_after_a_delta)

    with gateway.http().stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as response:
        frames = response.read().decode().split("\n\n")[:-1]

    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2].removeprefix("data: "))["error"]["code"] == "job_lost"
    assert '"Hel"' in frames[1]


def test_a_job_waiting_for_a_worker_is_not_lost(make_gateway, make_peer, redis_client: redis.Redis) -> None:
    gateway = make_gateway(request_timeout_s=DEADLINE_S)  # event_poll_s 0.2: many silences while it waits
    peer = make_peer(consume=False)

    start = _once_queued(redis_client, 1.5, lambda: setattr(peer, "consume", True))

    response = gateway.http().post("/v1/chat/completions", json=CHAT)

    start.join()
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "Hello, world"
