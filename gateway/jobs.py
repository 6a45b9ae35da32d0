"""Putting a job on a model's stream, and taking it back when the client is gone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from redis.asyncio import Redis

from shared import keys
from shared.openai_schema import ChatCompletionRequest, GenerationRequest
from shared.protocol import CANCEL_TTL_S, CancelMessage, Job, JobKind
from shared.redis_connect import NoReplica

ID_PREFIXES: dict[JobKind, str] = {"chat": "chatcmpl", "completion": "cmpl", "count": "count", "tokenize": "tok"}
MARKER_MARGIN_S = 60  # the marker outlives the job's deadline by this much

# KEYS: the model's stream, the request's enqueued marker.  ARGV: the marker's ttl, the queue
# limit, then the job's field/value pairs.  Returns the entry id (the new one, or the first one if
# the job is already in), or {length} when the stream already holds the limit.
_ENQUEUE = """
local existing = redis.call('GET', KEYS[2])
if existing then return existing end
local length = redis.call('XLEN', KEYS[1])
if length >= tonumber(ARGV[2]) then return {length} end
local entry = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 3))
redis.call('SET', KEYS[2], entry, 'EX', ARGV[1])
return entry
"""


class QueueFull(Exception):
    """The model's stream holds `max_queue` jobs (waiting or running) already."""

    def __init__(self, length: int) -> None:
        super().__init__(f"{length} jobs queued")
        self.length = length


def new_job(
    kind: JobKind, req: GenerationRequest, default_max_tokens: int, timeout_s: float, make_id: Callable[[str], str]
) -> Job:
    """The job for a validated request; max_tokens is resolved here so workers see one number.
    `make_id` turns the id prefix into a request id (the event hub's, so it hears the events)."""
    requested = req.requested_max_tokens()
    updates: dict[str, int | None] = {"max_tokens": default_max_tokens if requested is None else requested}
    if isinstance(req, ChatCompletionRequest):
        updates["max_completion_tokens"] = None
    body = req.model_copy(update=updates).model_dump_json(exclude_none=True)
    now = time.time()
    return Job(
        id=make_id(ID_PREFIXES[kind]),
        model=req.model,
        kind=kind,
        body=body,
        created=now,
        deadline=now + timeout_s,
    )


async def enqueue(redis: Redis, job: Job, max_queue: int, min_replicas: int = 0, wait_ms: int = 0) -> str:
    """XADD without MAXLEN (a queued job is never trimmed), at most once per request, unless the
    stream already holds `max_queue` entries (raises QueueFull); returns the entry id.

    The limit is checked in the same script as the XADD, so it holds under any concurrency: waiting
    + pending is the stream's length, since workers XACK *and* XDEL a finished job in one script
    (see `shared.queue_stats`).

    At most once because a client with retries on (redis-py's `Retry`; the gateway's pool has none
    today) resends a command whose reply was lost, to a connection reset or a socket timeout while
    Redis stalls: a plain XADD retried after it landed would queue the job twice, and two workers
    would run it and interleave their events. The script adds the entry and a marker holding its
    id in one step, so a retry finds the marker and returns the first id.

    With `min_replicas`, the job counts as queued only once that many replicas confirm it (`WAIT`
    on the same connection, up to `wait_ms`); else raises NoReplica, and the caller cancels the
    job: a failover could lose a write only the master had, so the client is told to send it
    again rather than told it was accepted.
    """
    ttl_s = max(math.ceil(job.deadline - time.time()), 0) + MARKER_MARGIN_S
    fields = [part for name, value in job.to_fields().items() for part in (name, value)]
    script_keys = [keys.request_stream(job.model), keys.enqueued_marker(job.id)]
    args: list[str | int] = [ttl_s, max_queue, *fields]
    script = redis.register_script(_ENQUEUE)
    if not min_replicas:
        return _entry_id(await script(keys=script_keys, args=args))
    async with redis.client() as pinned:  # WAIT confirms the writes of its own connection only
        entry_id = _entry_id(await script(keys=script_keys, args=args, client=pinned))
        confirmed = await pinned.wait(min_replicas, wait_ms)
    if confirmed < min_replicas:
        raise NoReplica(f"{confirmed} of {min_replicas} replica(s) confirmed the job within {wait_ms} ms")
    return entry_id


def _entry_id(reply: str | list[int]) -> str:
    if isinstance(reply, list):
        raise QueueFull(int(reply[0]))
    return reply  # decode_responses=True


async def cancel(redis: Redis, request_id: str) -> None:
    """Tell workers to drop the request: a cancel key for the next step check, and a broadcast."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)
        pipe.publish(keys.CONTROL_CHANNEL, CancelMessage(id=request_id).model_dump_json())
        await pipe.execute()
