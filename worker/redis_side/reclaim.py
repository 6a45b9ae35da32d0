"""Taking over the jobs of workers that died, and giving up on jobs that keep killing workers.

Live workers touch their entries every beat (see `worker.redis_side.heartbeat`), so an entry idle for longer
than the heartbeat TTL belongs to a worker that stopped beating. One reclaim round:

  1. XPENDING IDLE ttl: who holds idle entries? Go on only if one of them has no heartbeat.
  2. XAUTOCLAIM min-idle ttl, COUNT = free lanes, from the cursor of the last round: the entries
     become ours; their delivery count (the attempt) goes up by one.
  3. Entries deleted from the stream meanwhile are acknowledged (Redis 6.2 keeps them pending).

The service then treats each claimed entry like a new one, except that it resumes from the job
state: prompt + emitted tokens, at the next seq. Past `max_attempts` deliveries it is a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys
from worker.redis_side.redis_io import RedisIO

MAX_PENDING_SCAN = 100  # idle entries inspected per round


@dataclass(slots=True)
class Reclaimer:
    io: RedisIO
    stream: str
    min_idle_ms: int  # the heartbeat TTL
    cursor: str = "0-0"

    async def claim(self, max_entries: int) -> list[tuple[str, dict[str, str]]]:
        """Entries of dead workers, now ours (at most `max_entries`)."""
        if max_entries <= 0 or not await self._dead_owner_exists():
            return []
        claim = await self.io.autoclaim(self.stream, self.min_idle_ms, max_entries, self.cursor)
        self.cursor = claim.next_id
        await self.io.ack_deleted(self.stream, claim.deleted_ids)
        return claim.entries

    async def _dead_owner_exists(self) -> bool:
        owners = await self.io.idle_owners(self.stream, self.min_idle_ms, MAX_PENDING_SCAN)
        owners.discard("")
        return bool(owners) and not all(await _alive(self.io.redis, sorted(owners)))


async def _alive(redis: Redis, worker_ids: list[str]) -> list[bool]:
    async with redis.pipeline(transaction=False) as pipe:
        for worker_id in worker_ids:
            pipe.exists(keys.worker_heartbeat(worker_id))
        return [bool(n) for n in await pipe.execute()]
