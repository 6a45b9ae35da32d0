"""Reclaiming dead workers' jobs, dead letters, and riding out a Redis restart (in-process workers).

A "ghost" plays a worker that read a job and died: it XREADGROUPs the entry, publishes a few
events and records them in the job state the way a worker does, then never beats or touches again.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import redis

from shared import keys
from shared.protocol import DeltaEvent, FinalEvent, JobState, encode_event
from tests.support.redis_server import RedisServer, redis_server_binary
from tests.worker.service.harness import (
    MODEL,
    InProcessWorker,
    chat_body,
    events_of,
    service_config,
    submit,
    text_of,
    token_ids_of,
    wait_done,
    wait_for,
)
from tests.worker.service.test_service import reference
from worker.redis_side.redis_io import parse_autoclaim
from worker.serving.lane_output import LaneOutput, OutputOptions

STREAM = keys.request_stream(MODEL)


def ghost_reads(client: redis.Redis, consumer: str = "ghost") -> str:
    """The ghost XREADGROUPs the next entry; returns its entry id."""
    with contextlib.suppress(redis.ResponseError):
        client.xgroup_create(STREAM, keys.CONSUMER_GROUP, id="0", mkstream=True)
    [[_, [(entry_id, _)]]] = client.xreadgroup(keys.CONSUMER_GROUP, consumer, {STREAM: ">"}, count=1)
    return entry_id


def ghost_publishes(client: redis.Redis, served, request_id: str, prompt_ids: list[int], token_ids: list[int]) -> None:
    """One delta per token, as a worker would have published them, and the state it would have left."""
    output = LaneOutput(served.tokenizer, OutputOptions(), prompt_ids)
    for seq, token in enumerate(token_ids):
        event = DeltaEvent(id=request_id, attempt=1, seq=seq, text=output.add([token]).text, token_ids=[token])
        client.rpush(keys.event_log(request_id), encode_event(event))
    state = JobState(worker="ghost", attempt=1, emitted_token_ids=[token_ids], next_seq=len(token_ids))
    client.hset(keys.job_state(request_id), mapping=state.to_fields())


@pytest.mark.parametrize("served_name", ["served_none", "served_hybrid"])
def test_a_dead_workers_job_is_reclaimed_and_the_stream_continues_seamlessly(
    redis_server, client, request, served_name
):
    served = request.getfixturevalue(served_name)
    body = chat_body("Once upon a time", max_tokens=24)
    prompt_ids, expected = reference(served, body)
    request_id = submit(client, body)
    ghost_reads(client)
    ghost_publishes(client, served, request_id, prompt_ids, expected.token_ids[:7])
    with InProcessWorker(service_config(redis_server.url), served):
        events = wait_done(client, request_id, timeout_s=30)
    assert text_of(events) == expected.text
    assert token_ids_of(events) == expected.token_ids
    assert [e.attempt for e in events] == [1] * 7 + [2] * (len(events) - 7)
    assert events[-1].usage.completion_tokens == len(expected.token_ids)
    assert client.xpending(STREAM, keys.CONSUMER_GROUP)["pending"] == 0


def test_only_jobs_of_workers_without_a_heartbeat_are_reclaimed(redis_server, client, served_none):
    request_id = submit(client, chat_body("Hello", max_tokens=4))
    ghost_reads(client, consumer="slow-but-alive")
    client.hset(keys.worker_heartbeat("slow-but-alive"), mapping={"worker_id": "slow-but-alive"})
    client.expire(keys.worker_heartbeat("slow-but-alive"), 60)
    with InProcessWorker(service_config(redis_server.url, heartbeat_ttl_s=0.5, heartbeat_interval_s=0.1), served_none):
        time.sleep(1.5)  # three TTLs: the entry is long idle, but its owner still beats
        assert events_of(client, request_id) == []
        client.delete(keys.worker_heartbeat("slow-but-alive"))
        assert isinstance(wait_done(client, request_id, timeout_s=10)[-1], FinalEvent)


def test_a_job_delivered_too_often_is_dead_lettered(redis_server, client, served_none):
    request_id = submit(client, chat_body("Hello", max_tokens=4))
    entry_id = ghost_reads(client)
    for _ in range(2):  # two more deliveries to dead workers: three in all
        client.xclaim(STREAM, keys.CONSUMER_GROUP, "ghost", 0, [entry_id])
    with InProcessWorker(service_config(redis_server.url, max_attempts=3), served_none):
        events = wait_done(client, request_id, timeout_s=10)
        letters = wait_for(lambda: client.xrange(keys.DEAD_LETTER_STREAM), 5, "the dead letter")
    assert [e.type for e in events] == ["error"] and events[0].code == "dead_letter" and events[0].attempt == 4
    [(_, fields)] = letters
    assert fields["id"] == request_id and fields["entry_id"] == entry_id
    assert client.xpending(STREAM, keys.CONSUMER_GROUP)["pending"] == 0 and client.xlen(STREAM) == 0


def test_xautoclaim_replies_of_redis_6_and_7_are_both_understood():
    six = ["0-0", [["1-0", ["id", "a"]], ["2-0", None]]]  # 6.2: a deleted entry comes back with nil fields
    seven = ["3-0", [["1-0", ["id", "a"]]], ["2-0"]]  # 7+: deleted ids in a third element
    for reply, next_id in ((six, "0-0"), (seven, "3-0")):
        claim = parse_autoclaim(reply)
        assert claim.next_id == next_id and claim.entries == [("1-0", {"id": "a"})] and claim.deleted_ids == ["2-0"]
    assert parse_autoclaim([b"0-0", [], []]).entries == []


class SamePortRedis:
    """A redis-server on a fixed loopback port, so a restart keeps the worker's URL."""

    def __init__(self, port: int):
        self.port = port
        self.process: subprocess.Popen | None = None
        self.folder = Path(tempfile.mkdtemp(prefix="arbor-redis-restart-"))

    def start(self) -> SamePortRedis:
        self.process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        connection = redis.Redis(port=self.port, socket_timeout=1)
        wait_for(lambda: _pings(connection), 10, "redis to start")
        connection.close()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(5)
            self.process = None


def _pings(connection: redis.Redis) -> bool:
    try:
        return bool(connection.ping())
    except redis.ConnectionError:
        return False


def test_the_worker_reconnects_after_redis_restarts(served_none):
    first = RedisServer(tcp=True).start()
    url = first.url
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    restarted = SamePortRedis(port)
    client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    try:
        with InProcessWorker(service_config(url), served_none):
            assert isinstance(wait_done(client, submit(client, chat_body("Before", max_tokens=4)))[-1], FinalEvent)
            first.stop()
            time.sleep(0.5)  # the worker's loops hit connection errors and back off
            restarted.start()
            request_id = wait_for(lambda: _submit_when_up(client), 10, "a job to be accepted")
            assert isinstance(wait_done(client, request_id, timeout_s=20)[-1], FinalEvent)
    finally:
        client.close()
        first.stop()
        restarted.stop()


def _submit_when_up(client: redis.Redis) -> str | None:
    try:
        return submit(client, chat_body("After", max_tokens=4))
    except redis.ConnectionError:
        return None
