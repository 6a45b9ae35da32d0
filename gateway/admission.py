"""May this request be queued? A live, ready worker for its model, and room in the model's stream.

    no live worker at all              -> 503 no_ready_worker (nothing can be served)
    live workers, none for this model  -> 404 model_not_found
    workers for it, none ready         -> 503 no_ready_worker
    waiting + pending >= max_queue     -> 429 queue_full, with Retry-After

The queue limit is soft under concurrency (two requests may both see room); it is a load guard,
not an invariant, and unread jobs are never trimmed to enforce it.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from gateway import errors
from shared.queue_stats import read_queue_stats
from shared.live_workers import live_workers
from shared.heartbeat import Heartbeat


async def admit(redis: Redis, model: str, max_queue: int, retry_after_s: int) -> None:
    """Raises ApiError when the request must be refused. Callers bound it with a timeout.

    The fleet and the queue are read at once (each is a few round trips): this is on every
    request's way to its first token."""
    fleet = asyncio.ensure_future(live_workers(redis))
    try:
        stats = await read_queue_stats(redis, model)
        workers = await fleet
    finally:  # owned here: a failure or timeout above must not leave it running, nor its error unread
        if not fleet.cancel() and not fleet.cancelled():
            fleet.exception()
    check_workers(workers, model)
    if stats.depth >= max_queue:
        raise errors.queue_full(model, stats.depth, retry_after_s)


def check_workers(workers: list[Heartbeat], model: str) -> None:
    if not workers:
        raise errors.no_ready_worker(None)
    serving = [worker for worker in workers if worker.model == model]
    if not serving:
        raise errors.model_not_found(model)
    if not any(worker.ready for worker in serving):
        raise errors.no_ready_worker(model)
