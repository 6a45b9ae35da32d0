"""The streams a worker takes jobs from: its own offer stream and one stream per priority class.

    offer_stream(model, me)           jobs placed on this worker by their prefix (`shared.placement`)
    request_stream(model, p)          jobs of class p, for any worker; the classes in use are the
                                      members of priority_classes(model) (the gateway adds them)

With a lane free, one XREADGROUP covers the offer stream and every class stream (the scheduler
orders what it gets by class). With every lane busy, only classes better than the worst running
lane are read, without blocking: such a job preempts that lane (`worker.serving.scheduler`).
The class list is re-read every CLASSES_REFRESH_S, so a class used for the first time is seen
within that.

Reclaiming covers every class stream and every worker's offer stream (the set
offer_streams(model)): a worker that read an offered job and died leaves it pending there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from redis.exceptions import ResponseError

from shared import keys
from worker.redis_side.reclaim import Reclaimer
from worker.redis_side.redis_io import RedisIO

CLASSES_REFRESH_S = 1.0


@dataclass(slots=True)
class JobStreams:
    io: RedisIO
    model: str
    min_idle_ms: int  # the heartbeat TTL: what the reclaimers wait for
    classes: list[tuple[int, str]] = field(default_factory=list)  # (priority, stream), best first
    _refreshed_at: float = float("-inf")
    _reclaimers: dict[str, Reclaimer] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.classes = self.classes or [(0, keys.request_stream(self.model))]

    @property
    def offer(self) -> str:
        return keys.offer_stream(self.model, self.io.worker_id)

    async def ensure_groups(self) -> None:
        """The consumer group on the offer stream and every known class stream; the offer stream
        listed for reclaimers."""
        for stream in [self.offer, *(stream for _, stream in self.classes)]:
            await self.io.ensure_group(stream)
        await self.io.redis.sadd(keys.offer_streams(self.model), self.offer)

    async def refresh(self) -> None:
        if time.monotonic() - self._refreshed_at < CLASSES_REFRESH_S:
            return
        members = cast(
            list[tuple[str, float]],
            await self.io.redis.zrange(keys.priority_classes(self.model), 0, -1, withscores=True),
        )
        priorities = sorted({0, *(int(score) for _, score in members)})
        self.classes = [(priority, keys.request_stream(self.model, priority)) for priority in priorities]
        self._refreshed_at = time.monotonic()

    def for_free_lanes(self) -> list[str]:
        return [self.offer, *(stream for _, stream in self.classes)]

    def better_than(self, priority: int) -> list[str]:
        return [stream for p, stream in self.classes if p < priority]

    async def reclaim(self, max_entries: int) -> list[tuple[str, str, dict[str, str]]]:
        """(stream, entry id, fields) of dead workers' jobs, now ours, at most `max_entries`."""
        streams = [stream for _, stream in self.classes]
        offers = cast(set[str], await self.io.redis.smembers(keys.offer_streams(self.model)))  # decode_responses
        streams += sorted(offers)
        claimed: list[tuple[str, str, dict[str, str]]] = []
        for stream in streams:
            if len(claimed) >= max_entries:
                break
            reclaimer = self._reclaimers.setdefault(stream, Reclaimer(self.io, stream, self.min_idle_ms))
            try:
                entries = await reclaimer.claim(max_entries - len(claimed))
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                continue  # a stream nobody has read yet (or gone with a Redis restart): nothing to reclaim
            claimed += [(stream, entry_id, fields) for entry_id, fields in entries]
        return claimed
