"""The live fleet, read from worker heartbeats. A worker is live while its heartbeat hash exists."""

from __future__ import annotations

import logging
from typing import cast

from pydantic import ValidationError
from redis.asyncio import Redis

from shared import keys
from shared.heartbeat import Heartbeat

log = logging.getLogger(__name__)


async def live_workers(redis: Redis) -> list[Heartbeat]:
    """Heartbeats of every live worker, sorted by id. Callers bound it with a timeout."""
    worker_ids = sorted(cast(set[str], await redis.smembers(keys.WORKERS_SET)))  # decode_responses=True
    if not worker_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id in worker_ids:
            pipe.hgetall(keys.worker_heartbeat(worker_id))
        rows = await pipe.execute()
    return [beat for beat in map(parse_heartbeat, worker_ids, rows) if beat is not None]


def parse_heartbeat(worker_id: str, fields: dict[str, str]) -> Heartbeat | None:
    """None for an expired (empty) or malformed heartbeat."""
    if not fields:
        return None  # expired: the worker stopped beating
    try:
        return Heartbeat.from_fields(fields)
    except ValidationError as exc:
        log.warning("ignoring malformed heartbeat of worker %s: %s", worker_id, exc)
        return None
