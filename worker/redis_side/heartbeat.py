"""The worker's heartbeat: counters kept by the owner thread, written to Redis by the asyncio side.

Each beat, in one transaction: the whole `Heartbeat` hash with its TTL, and this worker's id in
`WORKERS_SET`. In the same beat the worker touches the idle time of every stream entry it holds,
so an entry idle longer than the heartbeat TTL belongs to a worker that stopped beating: that
is what lets the reclaimer's XAUTOCLAIM (min idle = TTL) take only dead workers' jobs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys
from shared.heartbeat import Heartbeat
from worker.models.capacity import Capacity
from worker.serving.handoff import WorkerCounters


@dataclass(slots=True, frozen=True)
class WorkerIdentity:
    worker_id: str
    model: str  # served model name
    speculation: str
    lanes_total: int
    max_context: int
    started_at: float
    aliases: tuple[str, ...] = ()  # other names clients may send for the model


def heartbeat(
    identity: WorkerIdentity,
    counters: WorkerCounters,
    ready: bool,
    lanes_busy: int,
    waiting_by_class: dict[int, int] | None = None,
    preemptions_by_class: dict[int, int] | None = None,
) -> Heartbeat:
    return Heartbeat(
        worker_id=identity.worker_id,
        model=identity.model,
        aliases=identity.aliases,
        speculation=identity.speculation,
        ready=ready,
        lanes_total=identity.lanes_total,
        lanes_busy=lanes_busy,
        max_context=identity.max_context,
        steps=counters.steps,
        tokens=counters.tokens,
        drafts=counters.drafts,
        draft_tokens=counters.draft_tokens,
        accepted_tokens=counters.accepted_tokens,
        draft_sources={source: counts.to_dict() for source, counts in list(counters.by_source.items())},
        prefix_cache_hits=counters.prefix_cache_hits,
        prefix_cache_queries=counters.prefix_cache_queries,
        waiting_by_class=dict(waiting_by_class or {}),
        preemptions_by_class=dict(preemptions_by_class or {}),
        **capacity_fields(counters.capacity),
        started_at=identity.started_at,
        beat_at=time.time(),
    )


def capacity_fields(capacity: Capacity | None) -> dict[str, int]:
    """The capacity gate's figures as heartbeat fields (zeros until the model is loaded)."""
    if capacity is None:
        return {}
    return {
        "kv_cache_bytes": capacity.cache_bytes,
        "kv_tokens": capacity.kv_tokens,
        "kv_bytes_per_token": capacity.kv_bytes_per_token,
        "state_bytes_per_lane": capacity.state_bytes_per_lane,
        "state_lanes": capacity.state_lanes,
        "weight_bytes": capacity.weight_bytes,
        "max_context_lanes": capacity.contexts,
    }


async def beat(redis: Redis, beat_fields: Heartbeat, ttl_s: float) -> None:
    key = keys.worker_heartbeat(beat_fields.worker_id)
    async with redis.pipeline(transaction=True) as pipe:
        # redis-py types `mapping` as Mapping[FieldT, ...], invariant in the key: it refuses a dict[str, str]
        pipe.hset(key, mapping=beat_fields.to_fields())  # type: ignore[arg-type]
        pipe.pexpire(key, int(ttl_s * 1000))
        pipe.sadd(keys.WORKERS_SET, beat_fields.worker_id)
        await pipe.execute()


async def retire(redis: Redis, worker_id: str) -> None:
    """A clean exit: the heartbeat goes at once (jobs left unfinished are reclaimed once idle for a TTL)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.worker_heartbeat(worker_id))
        pipe.srem(keys.WORKERS_SET, worker_id)
        await pipe.execute()
