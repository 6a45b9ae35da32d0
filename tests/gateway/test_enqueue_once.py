"""A job is queued once even when the command that queued it is retried.

A client with retries on (redis-py's `Retry`) resends a command whose reply was lost; here a proxy
passes the command to a real Redis, then drops the connection instead of passing the reply back.
A plain XADD retried that way queues the job twice, and two workers would run it and interleave
their events; `gateway.jobs.enqueue` must not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.jobs import enqueue
from shared import keys
from shared.protocol import Job
from tests.support.redis_server import RedisServer

MODEL = "tiny"


class ReplyDroppingProxy:
    """TCP between a client and Redis; drops the connection instead of relaying the reply to the
    first command that contains `marker` and succeeds (not an error reply)."""

    def __init__(self, redis_port: int, marker: bytes):
        self.redis_port = redis_port
        self.marker = marker
        self.dropped = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"redis://127.0.0.1:{port}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        redis_reader, redis_writer = await asyncio.open_connection("127.0.0.1", self.redis_port)
        try:
            while command := await client_reader.read(65536):
                redis_writer.write(command)
                await redis_writer.drain()
                reply = await redis_reader.read(65536)
                if self.marker in command and not reply.startswith(b"-") and not self.dropped:
                    self.dropped += 1  # it ran on Redis; the client never hears so, and retries
                    return
                client_writer.write(reply)
                await client_writer.drain()
        finally:
            client_writer.close()
            redis_writer.close()


def _job() -> Job:
    now = time.time()
    return Job(id="chatcmpl-once", model=MODEL, kind="chat", body="{}", created=now, deadline=now + 60)


async def _queue_through_proxy(redis_port: int, marker: bytes, queue) -> tuple[int, object]:
    proxy = ReplyDroppingProxy(redis_port, marker)
    async with proxy as url:
        client = redis.asyncio.Redis.from_url(url, decode_responses=True, retry=Retry(NoBackoff(), 3))
        try:
            result = await queue(client)
        finally:
            await client.aclose()
    assert proxy.dropped == 1, "the proxy must have swallowed one reply"
    return proxy.dropped, result


@pytest.fixture()
def tcp_redis() -> Iterator[RedisServer]:
    with RedisServer(tcp=True) as server:
        yield server


def test_a_retried_enqueue_queues_the_job_once(tcp_redis):
    job = _job()
    _, queued = asyncio.run(
        _queue_through_proxy(
            tcp_redis.port, keys.enqueued_marker(job.id).encode(), lambda client: enqueue(client, job, max_queue=10)
        )
    )
    plain = redis.Redis.from_url(tcp_redis.url, decode_responses=True)
    entries = plain.xrange(keys.request_stream(MODEL))
    assert [entry for entry, _ in entries] == [queued.entry_id], "one entry, and the id the gateway was told"
    assert queued.stream == keys.request_stream(MODEL)
    assert Job.from_fields(entries[0][1]) == job
    ttl = plain.ttl(keys.enqueued_marker(job.id))
    assert 60 < ttl <= 60 + 60 + 1, "the marker outlives the job's deadline, then goes"


def test_the_proxy_does_make_a_plain_xadd_queue_twice(tcp_redis):
    """The fault is real: without the marker, redis-py's retry queues a second entry."""
    job = _job()
    asyncio.run(
        _queue_through_proxy(
            tcp_redis.port, b"XADD", lambda client: client.xadd(keys.request_stream(MODEL), job.to_fields())
        )
    )
    plain = redis.Redis.from_url(tcp_redis.url)
    assert plain.xlen(keys.request_stream(MODEL)) == 2
