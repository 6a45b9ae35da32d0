"""Which worker holds a request's stream entry, read from Redis as the reclaimers read it."""

from __future__ import annotations

import redis

from shared import keys


def job_owner(client: redis.Redis, stream: str, request_id: str) -> str | None:
    """The consumer the request's entry is pending for (a worker id), if any. `client` decodes."""
    for entry_id, fields in client.xrange(stream):
        if fields.get("id") == request_id:
            pending = client.xpending_range(stream, keys.CONSUMER_GROUP, min=entry_id, max=entry_id, count=1)
            return pending[0]["consumer"] if pending else None
    return None


def job_owner_in_any_stream(client: redis.Redis, model: str, request_id: str) -> str | None:
    """The same, looking in the model's priority-0 stream and every worker's offer stream (a job
    placed on a worker by its prefix is read from there)."""
    streams = [keys.request_stream(model), *sorted(client.smembers(keys.offer_streams(model)))]
    for stream in streams:
        owner = job_owner(client, stream, request_id)
        if owner is not None:
            return owner
    return None
