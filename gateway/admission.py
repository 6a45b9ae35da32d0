"""May this request be queued? A live, ready worker for its model, and room in the model's stream.

    no live worker at all              -> 503 no_ready_worker (nothing can be served)
    live workers, none for this model  -> 404 model_not_found
    workers for it, none ready         -> 503 no_ready_worker
    waiting + pending >= max_queue     -> 429 queue_full, with Retry-After

Everything is read in one script call, because admission is on every request's way to its first
token: the fleet's heartbeats and the stream's length. Waiting + pending is the stream's length:
workers XACK *and* XDEL a finished job in one script (see `shared.queue_stats`).

The queue limit is soft under concurrency (two requests may both see room); it is a load guard,
not an invariant, and unread jobs are never trimmed to enforce it.
"""

from __future__ import annotations

from redis.asyncio import Redis

from gateway import errors
from shared import keys
from shared.heartbeat import Heartbeat
from shared.live_workers import parse_heartbeat

# KEYS: the workers set, the model's request stream.  ARGV: the heartbeat key prefix.
# Returns {{worker id, heartbeat as a flat HGETALL list, ...}, stream length}.
_READ = """
local fleet = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  fleet[#fleet + 1] = id
  fleet[#fleet + 1] = redis.call('HGETALL', ARGV[1] .. id)
end
return {fleet, redis.call('XLEN', KEYS[2])}
"""


class Admission:
    def __init__(self, redis: Redis, max_queue: int, retry_after_s: int) -> None:
        self._read = redis.register_script(_READ)
        self.max_queue = max_queue
        self.retry_after_s = retry_after_s

    async def admit(self, model: str) -> None:
        """Raises ApiError when the request must be refused. Callers bound it with a timeout."""
        fleet, depth = await self._read(keys=[keys.WORKERS_SET, keys.request_stream(model)],
                                        args=[keys.worker_heartbeat("")])
        rows = dict(zip(fleet[::2], map(_pairs, fleet[1::2]), strict=True))
        workers = [beat for worker_id in sorted(rows) if (beat := parse_heartbeat(worker_id, rows[worker_id]))]
        check_workers(workers, model)
        if int(depth) >= self.max_queue:
            raise errors.queue_full(model, int(depth), self.retry_after_s)


def check_workers(workers: list[Heartbeat], model: str) -> None:
    if not workers:
        raise errors.no_ready_worker(None)
    serving = [worker for worker in workers if worker.model == model]
    if not serving:
        raise errors.model_not_found(model)
    if not any(worker.ready for worker in serving):
        raise errors.no_ready_worker(model)


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))
