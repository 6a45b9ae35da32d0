"""The gateway's half of prefix placement (`shared.placement`): taking an offer back when its worker
has not read it within the offer wait (the offer itself is made by the enqueue script, `gateway.jobs`)."""

from __future__ import annotations

from redis.asyncio import Redis

from shared import keys, placement
from shared.protocol import Job


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
