"""The one Redis connection factory: URLs it accepts, and clients that follow a Sentinel set's
master through failovers (real redis-server processes: tests/support/sentinel_set.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from shared.redis_connect import SentinelTarget, async_client, parse_sentinel_url, sync_client
from tests.support.sentinel_set import SentinelSet

TIMEOUT_S = 1.0


def test_plain_urls_are_not_sentinel_urls() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380", "unix:///tmp/redis.sock"):
        assert parse_sentinel_url(url) is None


def test_a_sentinel_url_names_every_sentinel_the_master_the_db_and_the_credentials() -> None:
    target = parse_sentinel_url("rediss+sentinel://app:s%40cret@s1:26379,s2:26380,[::1]:26381/main/3?sentinel_ssl=1")
    assert target == SentinelTarget(
        sentinels=(("s1", 26379), ("s2", 26380), ("::1", 26381)),
        master_name="main",
        db=3,
        username="app",
        password="s@cret",
        ssl=True,
        sentinel_ssl=True,
    )
    assert parse_sentinel_url("redis+sentinel://s1/mymaster") == SentinelTarget((("s1", 26379),), "mymaster")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:pw@s1:26379", "MASTER_NAME"),
        ("redis+sentinel://:pw@s1:26379/m/x", "a number"),
        ("redis+sentinel://:pw@s1:port/m", "HOST:PORT"),
        ("redis+sentinel:///m", "MASTER_NAME"),
    ],
)
def test_a_malformed_sentinel_url_is_an_error_naming_the_part_without_the_password(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says) as error:
        parse_sentinel_url(url)
    assert "pw" not in str(error.value)


@pytest.fixture
def cluster() -> Iterator[SentinelSet]:
    with SentinelSet() as running:
        yield running


def _write_until_it_lands(client: redis.Redis, key: str, value: int) -> float:
    """Seconds until a confirmed write of `value` succeeds (the write gap while it fails)."""
    started = time.monotonic()
    while True:
        try:
            with client.pipeline(transaction=False) as pipe:
                pipe.rpush(key, value)
                pipe.wait(1, 500)
                _, confirmed = pipe.execute()
            if confirmed >= 1:
                return time.monotonic() - started
        except (redis.ConnectionError, redis.TimeoutError):
            time.sleep(0.02)
        if time.monotonic() - started > 60:
            raise AssertionError(f"no write landed within 60 s after {value}")


# slow, out of the default run: its second failover has now and then seen no master elected within
# 60 s, on a quiet machine too (ops/launch/sentinel_set.py's harness or the sentinels' timing, not yet
# found); run it with -m slow
@pytest.mark.slow
def test_a_sync_client_follows_the_master_through_two_sigkill_failovers_and_loses_no_confirmed_write(
    cluster: SentinelSet,
) -> None:
    client = sync_client(cluster.url, TIMEOUT_S, decode_responses=True)
    gaps = []
    value = 0
    for _ in range(2):
        cluster.wait_for_replicas(2)  # both replicas in sync (the one restarted last round too) before a kill
        for _ in range(20):
            _write_until_it_lands(client, "log", value)
            value += 1
        old = cluster.kill_master()
        gaps.append(_write_until_it_lands(client, "log", value))
        value += 1
        new = cluster.wait_for_new_master(old)
        assert new is not old and cluster.master() is new
        cluster.restart(old)
    assert client.lrange("log", 0, -1) == [str(number) for number in range(value)], "every confirmed write kept"
    print(f"write gaps across SIGKILL failovers: {', '.join(f'{gap:.2f}' for gap in gaps)} s")
    client.close()


def test_pub_sub_through_sentinel_subscribes_again_on_the_new_master(cluster: SentinelSet) -> None:
    async def main() -> list[str]:
        client = async_client(cluster.url, TIMEOUT_S)
        pubsub = client.pubsub()
        await pubsub.psubscribe("events:*")
        old = cluster.kill_master()
        await asyncio.to_thread(cluster.wait_for_new_master, old)
        received: list[str] = []
        publisher = async_client(cluster.url, TIMEOUT_S)
        deadline = time.monotonic() + 60
        while not received and time.monotonic() < deadline:
            try:
                message = await pubsub.get_message(timeout=0.2)
                if message is not None and message["type"] == "pmessage":
                    received.append(message["data"])
                await publisher.publish("events:1", "after the failover")
            except (redis.ConnectionError, redis.TimeoutError):
                await asyncio.sleep(0.05)
        await pubsub.aclose()
        await client.aclose()
        await publisher.aclose()
        return received

    assert asyncio.run(main())[:1] == ["after the failover"]


async def _confirmed(client: redis.asyncio.Redis, key: str) -> bool:
    """A write and its WAIT on one connection: True if a replica confirmed it."""
    try:
        await client.set(key, "1")
        return int(await client.wait(1, 500)) >= 1
    except redis.ConnectionError:  # NoReplica (NOREPLICAS), or READONLY once it was demoted
        return False


def test_a_master_frozen_through_a_failover_cannot_confirm_a_write_of_a_client_still_connected_to_it(
    cluster: SentinelSet,
) -> None:
    """Right after SIGCONT the old master may still take a plain write (it counts its replicas
    once a second, and they have left it): only a confirmed write is safe, and it is refused."""

    async def main() -> None:
        client = async_client(cluster.url, TIMEOUT_S)
        assert await client.set("before", "1")
        async with client.client() as pinned:  # one connection, to the master that will freeze
            assert await pinned.set("pinned", "1")
            frozen = cluster.master()
            assert frozen.process is not None
            os.kill(frozen.process.pid, signal.SIGSTOP)
            try:
                await asyncio.to_thread(cluster.wait_for_new_master, frozen)
            finally:
                os.kill(frozen.process.pid, signal.SIGCONT)
            assert not await _confirmed(pinned, "lost")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # through the pool: rediscovered, on the new master
            try:
                assert await client.set("after", "1")
                break
            except redis.ConnectionError:
                await asyncio.sleep(0.05)
        assert await client.get("lost") is None, "what the old master took is lost: it was never confirmed"
        assert await client.get("before") == "1"
        await client.aclose()

    asyncio.run(main())
    with cluster.master().client() as direct:
        assert direct.get("after") == "1"
