"""The event hub: one pattern subscription per gateway, routing its own requests' events only."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc

import pytest
from redis.asyncio import Redis

from gateway.hub import EventHub
from shared import keys
from tests.support.redis_server import RedisServer


def test_each_hub_hears_its_own_requests_only_and_needs_no_subscribe_per_request(redis_server) -> None:
    async def main() -> None:
        redis = Redis.from_url(redis_server.url, decode_responses=True)
        mine, theirs = EventHub(redis, 5.0), EventHub(redis, 5.0)
        await mine.start()
        await theirs.start()
        try:
            ours_id, their_id = mine.request_id("chatcmpl"), theirs.request_id("cmpl")
            assert ours_id.startswith(f"chatcmpl-{mine.token}") and their_id.startswith(f"cmpl-{theirs.token}")
            async with mine.subscription(ours_id) as queue, theirs.subscription(their_id) as their_queue:
                channels = await redis.pubsub_channels()
                assert not channels, "no per-request channel subscriptions"
                assert await redis.pubsub_numpat() == 2
                for n in range(3):
                    await redis.publish(keys.events_channel(ours_id), f"ours {n}")
                await redis.publish(keys.events_channel(their_id), "theirs")
                await redis.publish(keys.events_channel(mine.request_id("chatcmpl")), "nobody waits for it")
                got = [await asyncio.wait_for(queue.get(), 5) for _ in range(3)]
                assert got == ["ours 0", "ours 1", "ours 2"], "in order"
                assert await asyncio.wait_for(their_queue.get(), 5) == "theirs"
                await asyncio.sleep(0.1)
                assert queue.empty()
            assert not mine._queues, "the queue goes with the request"
        finally:
            await mine.stop()
            await theirs.stop()
            await redis.aclose()

    asyncio.run(main())


def test_with_redis_down_a_subscription_times_out_and_the_hub_listens_again_once_it_is_back() -> None:
    async def main(server: RedisServer) -> None:
        redis = Redis.from_url(server.url, decode_responses=True)
        hub = EventHub(redis, 0.5)
        await hub.start()
        try:
            request_id = hub.request_id("chatcmpl")
            async with hub.subscription(request_id):
                pass
            server.stop(keep_data=True)
            await asyncio.sleep(0.3)
            with pytest.raises(TimeoutError):
                async with hub.subscription(hub.request_id("chatcmpl")):
                    pass
            server.start()
            deadline = asyncio.get_running_loop().time() + 20
            while True:
                try:
                    async with hub.subscription(request_id) as queue:
                        await redis.publish(keys.events_channel(request_id), "back")
                        assert await asyncio.wait_for(queue.get(), 5) == "back"
                        break
                except TimeoutError:
                    assert asyncio.get_running_loop().time() < deadline, "the hub never listened again"
        finally:
            await hub.stop()
            await redis.aclose()

    server = RedisServer(persist=True).start()
    try:
        asyncio.run(main(server))
    finally:
        server.stop()


def test_routing_many_events_keeps_no_memory(redis_server) -> None:
    """hiredis 3.3 under redis-py's asyncio PubSub kept every message alive: ~1 KB per request."""

    async def main() -> int:
        redis = Redis.from_url(redis_server.url, decode_responses=True)
        hub = EventHub(redis, 5.0)
        await hub.start()
        try:
            request_id = hub.request_id("chatcmpl")
            async with hub.subscription(request_id) as queue:

                async def route(count: int) -> None:
                    for n in range(count):
                        await redis.publish(keys.events_channel(request_id), f'{{"seq": {n}, "text": "hello"}}')
                    for _ in range(count):
                        await asyncio.wait_for(queue.get(), 5)

                await route(500)  # warm-up: connections, buffers, caches
                gc.collect()
                tracemalloc.start()
                before = tracemalloc.take_snapshot()
                await route(5000)
                gc.collect()
                after = tracemalloc.take_snapshot()
                tracemalloc.stop()
            return sum(stat.count_diff for stat in after.compare_to(before, "filename"))
        finally:
            await hub.stop()
            await redis.aclose()

    assert asyncio.run(main()) < 1000, "blocks still alive after routing 5000 events"
