"""`arbor top`: a live terminal view of request queues and workers, read straight from Redis.

Tokens/s is the change in each worker's token counter between two frames (one second apart);
`--once` takes two quick samples so the single frame it prints has a rate too.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from ops.launch.stack_file import find_stack, runtime_dir
from shared.fleet import FleetSnapshot, read_fleet
from shared.heartbeat import Heartbeat
from shared.redis_connect import async_client

REDIS_TIMEOUT_S = 5.0
ONCE_SAMPLE_GAP_S = 1.0


def add_top_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("top", help="live view of queues and workers")
    parser.add_argument(
        "--redis-url", default=None, help="Redis to watch (default: REDIS_URL, else the running `arbor up`'s)"
    )
    parser.add_argument("--port", type=int, default=None, help="which `arbor up` to watch, when several run")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    parser.set_defaults(handler=run_top)


def run_top(args: argparse.Namespace) -> int:
    url = args.redis_url or os.environ.get("REDIS_URL") or find_stack(runtime_dir(), args.port).redis_url
    return asyncio.run(_top(url, args.once, args.interval))


async def _top(url: str, once: bool, interval_s: float) -> int:
    redis = async_client(url, REDIS_TIMEOUT_S)
    try:
        previous = await _sample(redis)
        if once:
            await asyncio.sleep(ONCE_SAMPLE_GAP_S)
            Console().print(render(await _sample(redis), previous))
            return 0
        with Live(render(previous, None), refresh_per_second=4, screen=False) as live:
            while True:
                await asyncio.sleep(interval_s)
                current = await _sample(redis)
                live.update(render(current, previous))
                previous = current
    except KeyboardInterrupt:
        return 0
    except (RedisError, OSError, TimeoutError) as error:
        raise StackUnreachable(f"cannot read Redis ({type(error).__name__}: {error}); is the stack running?") from None
    finally:
        await redis.aclose()


class StackUnreachable(ConnectionError):
    """The Redis `arbor top` was pointed at does not answer: one line on the CLI, not a traceback."""


async def _sample(redis: Redis) -> tuple[float, FleetSnapshot]:
    snapshot = await asyncio.wait_for(read_fleet(redis), REDIS_TIMEOUT_S)
    return time.time(), snapshot


def render(current: tuple[float, FleetSnapshot], previous: tuple[float, FleetSnapshot] | None) -> Group:
    now, fleet = current
    parts: list[Table | str] = [_queue_table(fleet), _class_table(fleet), _worker_table(fleet, now, previous)]
    if fleet.placements:
        parts.append(_placement_line(fleet))
    if fleet.restarts:
        counts = ", ".join(f"{name} {count}" for name, count in sorted(fleet.restarts.items()))
        parts.append(f"restarts by arbor up: {counts}")
    return Group(*parts)


def _queue_table(fleet: FleetSnapshot) -> Table:
    table = Table(title=f"request streams (dead letters: {fleet.dead_letters})")
    for column in ("model", "waiting", "pending", "oldest age s"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model, stats in sorted(fleet.queues.items()):
        table.add_row(model, str(stats.waiting), str(stats.pending), f"{stats.oldest_age_s:.1f}")
    return table


def _class_table(fleet: FleetSnapshot) -> Table:
    """Per priority class (lower runs sooner): jobs in Redis, lanes waiting inside workers, preemptions."""
    table = Table(title="priority classes")
    for column in ("model", "priority", "waiting", "pending", "waiting in workers", "preempted"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for model, by_class in sorted(fleet.class_queues.items()):
        beats = [beat for beat in fleet.workers if beat.model == model]
        for priority, stats in sorted(by_class.items()):
            in_workers = sum(beat.waiting_by_class.get(priority, 0) for beat in beats)
            preempted = sum(beat.preemptions_by_class.get(priority, 0) for beat in beats)
            table.add_row(model, str(priority), str(stats.waiting), str(stats.pending), str(in_workers), str(preempted))
    return table


def _placement_line(fleet: FleetSnapshot) -> str:
    """Placement decisions so far: routed to the prefix's worker, shared, offers taken back."""
    parts = []
    for model, counts in sorted(fleet.placements.items()):
        routed, shared, moved = (counts.get(name, 0) for name in ("routed", "shared", "moved"))
        parts.append(f"{model}: routed {routed}, shared {shared}, taken back {moved}")
    return "placement: " + "; ".join(parts)


def _worker_table(fleet: FleetSnapshot, now: float, previous: tuple[float, FleetSnapshot] | None) -> Table:
    table = Table(title=f"workers ({len(fleet.workers)} live)")
    for column in ("worker", "model", "mode", "ready", "lanes", "tokens/s", "accept len", "prefix hits", "beat age s"):
        table.add_column(column, justify="left" if column in ("worker", "model", "mode") else "right")
    before = {beat.worker_id: beat for beat in previous[1].workers} if previous else {}
    elapsed_s = now - previous[0] if previous else 0.0
    for beat in fleet.workers:
        table.add_row(
            beat.worker_id,
            beat.model,
            beat.speculation,
            "yes" if beat.ready else "no",
            f"{beat.lanes_busy}/{beat.lanes_total}",
            _tokens_per_s(beat, before.get(beat.worker_id), elapsed_s),
            f"{1 + beat.accepted_tokens / beat.drafts:.2f}" if beat.drafts else "-",
            _hit_rate(beat),
            f"{beat.age_s(now):.1f}",
        )
    return table


def _hit_rate(beat: Heartbeat) -> str:
    if not beat.prefix_cache_queries:
        return "-"
    hits, queries = beat.prefix_cache_hits, beat.prefix_cache_queries
    return f"{hits}/{queries} ({hits / queries:.0%})"


def _tokens_per_s(beat: Heartbeat, before: Heartbeat | None, elapsed_s: float) -> str:
    if before is None or elapsed_s <= 0 or beat.tokens < before.tokens:
        return "-"
    return f"{(beat.tokens - before.tokens) / elapsed_s:.1f}"
