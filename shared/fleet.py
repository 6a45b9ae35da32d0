"""A point-in-time view of queues and workers, read from Redis for /metrics and /health."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from redis.asyncio import Redis

from shared import keys
from shared.heartbeat import Heartbeat
from shared.live_workers import live_workers
from shared.queue_stats import QueueStats, read_queue_stats


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    redis_up: bool
    workers: list[Heartbeat]
    queues: dict[str, QueueStats]  # by model, for every model a live worker serves (all classes together)
    dead_letters: int
    restarts: dict[str, int]  # by process name: what `arbor up` restarted (empty under compose)
    # by model, then priority: each class stream's depth
    class_queues: dict[str, dict[int, QueueStats]] = field(default_factory=dict)
    placements: dict[str, dict[str, int]] = field(default_factory=dict)  # by model: outcome -> count

    def by_model_and_mode(self) -> dict[tuple[str, str], list[Heartbeat]]:
        groups: dict[tuple[str, str], list[Heartbeat]] = {}
        for beat in self.workers:
            groups.setdefault((beat.model, beat.speculation), []).append(beat)
        return groups


async def read_fleet(redis: Redis) -> FleetSnapshot:
    """Callers bound it with a timeout."""
    workers = await live_workers(redis)
    models = sorted({beat.model for beat in workers})
    class_queues = {model: await _class_queues(redis, model) for model in models}
    queues = {model: _together(list(class_queues[model].values())) for model in models}
    placements = {model: await _placements(redis, model) for model in models}
    dead_letters = await redis.xlen(keys.DEAD_LETTER_STREAM)
    restarts = {_text(name): int(count) for name, count in (await redis.hgetall(keys.PROCESS_RESTARTS)).items()}
    return FleetSnapshot(
        redis_up=True,
        workers=workers,
        queues=queues,
        dead_letters=dead_letters,
        restarts=restarts,
        class_queues=class_queues,
        placements=placements,
    )


async def _class_queues(redis: Redis, model: str) -> dict[int, QueueStats]:
    members = cast(list[str], await redis.zrange(keys.priority_classes(model), 0, -1))  # decode_responses
    priorities = sorted({0, *(int(member) for member in members)})
    return {priority: await read_queue_stats(redis, model, priority) for priority in priorities}


def _together(stats: list[QueueStats]) -> QueueStats:
    return QueueStats(
        sum(s.waiting for s in stats), sum(s.pending for s in stats), max((s.oldest_age_s for s in stats), default=0.0)
    )


async def _placements(redis: Redis, model: str) -> dict[str, int]:
    counts = await redis.hgetall(keys.placement_counts(model))
    return {_text(outcome): int(count) for outcome, count in counts.items()}


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
