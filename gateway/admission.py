"""May this request be queued? A live, ready worker for its model, and room in the model's stream.

A request may name the model or one of its aliases (a worker's `--served-model-name name,alias`);
`admit` returns the model's own name, the stream the job goes to.

    no live worker at all              -> 503 no_ready_worker (nothing can be served)
    live workers, none for this model  -> 404 model_not_found
    workers for it, none ready         -> 503 no_ready_worker
    waiting + pending >= max_queue     -> 429 queue_full, with Retry-After

Admission is on every request's way to its first token, so it costs no Redis round trip of its own
in the common case:
- the fleet (heartbeats) is read in one script call, and a read that found a ready worker for a
  model is trusted for FLEET_FRESH_S: heartbeats themselves only change every second and a dead
  worker's lasts its TTL (seconds), so this adds little staleness. A refusal is never remembered:
  the next request reads again, so a worker that just became ready is seen at once;
- the queue limit is checked by the enqueue script itself, in the same step as the XADD
  (`gateway.jobs.enqueue`), so it holds exactly under any concurrency. Unread jobs are never
  trimmed to enforce it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from redis.asyncio import Redis

from gateway import errors
from shared import keys
from shared.heartbeat import Heartbeat
from shared.live_workers import parse_heartbeat

FLEET_FRESH_S = 0.5  # how long a fleet read that found a ready worker for a model is trusted

# KEYS: the workers set.  ARGV: the heartbeat key prefix.
# Returns {worker id, heartbeat as a flat HGETALL list, ...}.
_READ = """
local fleet = {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  fleet[#fleet + 1] = id
  fleet[#fleet + 1] = redis.call('HGETALL', ARGV[1] .. id)
end
return fleet
"""


class Admission:
    def __init__(self, redis: Redis, clock: Callable[[], float] = time.monotonic) -> None:
        self._read = redis.register_script(_READ)
        self._clock = clock
        # requested name -> (when a read last found a ready worker for it, the model's own name)
        self._servable_at: dict[str, tuple[float, str]] = {}

    async def admit(self, model: str) -> str:
        """The name of the model `model` names (itself, or the model it is an alias of). Raises
        ApiError when no worker can serve it. Callers bound it with a timeout."""
        found = self._servable_at.get(model)
        if found is not None and self._clock() - found[0] < FLEET_FRESH_S:
            return found[1]
        fleet = await self._read(keys=[keys.WORKERS_SET], args=[keys.worker_heartbeat("")])
        rows = dict(zip(fleet[::2], map(_pairs, fleet[1::2]), strict=True))
        workers = [beat for worker_id in sorted(rows) if (beat := parse_heartbeat(worker_id, rows[worker_id]))]
        served = check_workers(workers, model)  # a refusal raises, and leaves nothing trusted
        self._servable_at[model] = (self._clock(), served)
        return served


def check_workers(workers: list[Heartbeat], model: str) -> str:
    """The served name of the model `model` names; its own name wins over another's alias."""
    if not workers:
        raise errors.no_ready_worker(None)
    serving = [worker for worker in workers if worker.model == model] or [w for w in workers if w.serves(model)]
    if not serving:
        raise errors.model_not_found(model)
    ready = [worker for worker in serving if worker.ready]
    if not ready:
        raise errors.no_ready_worker(model)
    return ready[0].model


def _pairs(flat: list[str]) -> dict[str, str]:
    return dict(zip(flat[::2], flat[1::2], strict=True))
