"""A point-in-time view of queues and workers, read from Redis for /metrics and /health."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys
from shared.heartbeat import Heartbeat
from shared.live_workers import live_workers
from shared.queue_stats import QueueStats, read_queue_stats


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    redis_up: bool
    workers: list[Heartbeat]
    queues: dict[str, QueueStats]  # by model, for every model a live worker serves
    dead_letters: int
    restarts: dict[str, int]  # by process name: what `arbor up` restarted (empty under compose)

    def by_model_and_mode(self) -> dict[tuple[str, str], list[Heartbeat]]:
        groups: dict[tuple[str, str], list[Heartbeat]] = {}
        for beat in self.workers:
            groups.setdefault((beat.model, beat.speculation), []).append(beat)
        return groups


async def read_fleet(redis: Redis) -> FleetSnapshot:
    """Callers bound it with a timeout."""
    workers = await live_workers(redis)
    models = sorted({beat.model for beat in workers})
    queues = {model: await read_queue_stats(redis, model) for model in models}
    dead_letters = await redis.xlen(keys.DEAD_LETTER_STREAM)
    restarts = {_text(name): int(count) for name, count in (await redis.hgetall(keys.PROCESS_RESTARTS)).items()}
    return FleetSnapshot(redis_up=True, workers=workers, queues=queues, dead_letters=dead_letters, restarts=restarts)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
