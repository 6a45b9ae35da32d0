"""The gateway's half of prefix placement (`shared.placement`): pick the worker to offer a job to,
and take the offer back if that worker has not read it within the offer wait."""

from __future__ import annotations

from redis.asyncio import Redis

from shared import keys, placement
from shared.protocol import Job


async def choose_worker(redis: Redis, job: Job) -> str | None:
    """The worker holding the longest prefix of the job that has a lane free, or None (counted
    either way). One script call; callers bound it with a timeout."""
    model = job.model
    owners = [keys.prefix_owner(model, h) for h in reversed(job.prefixes.split())]
    reply = await redis.register_script(placement.ROUTE_SCRIPT)(
        keys=[keys.placement_counts(model)],
        args=[keys.worker_heartbeat(""), keys.offer_stream(model, ""), model, *owners],
    )
    return reply if isinstance(reply, str) and reply else None


async def take_back(redis: Redis, job: Job, offer_stream: str, entry_id: str) -> str | None:
    """Move the entry, if still unread, from the offer stream to its class stream; its new id, or
    None if a worker read it first. Callers bound it with a timeout."""
    reply = await redis.register_script(placement.MOVE_SCRIPT)(
        keys=[
            offer_stream,
            keys.request_stream(job.model, job.priority),
            keys.enqueued_marker(job.id),
            keys.placement_counts(job.model),
        ],
        args=[entry_id, keys.CONSUMER_GROUP],
    )
    return reply if isinstance(reply, str) and reply else None
