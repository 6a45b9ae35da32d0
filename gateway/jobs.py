"""Putting a job on a model's stream, and taking it back when the client is gone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.asyncio import Redis

from shared import keys, placement
from shared.openai_schema import ChatCompletionRequest, GenerationRequest
from shared.protocol import CANCEL_TTL_S, CancelMessage, Job, JobKind
from shared.redis_connect import NoReplica

ID_PREFIXES: dict[JobKind, str] = {"chat": "chatcmpl", "completion": "cmpl", "count": "count", "tokenize": "tok"}
MARKER_MARGIN_S = 60  # the marker outlives the job's deadline by this much

# KEYS: the request's enqueued marker, its class stream, the model's classes, the model's placement
# counts.  ARGV: the marker's ttl, the queue limit, the priority, the consumer group, placement
# (1 or 0), the heartbeat key prefix, the offer stream prefix, the model, the number n of prefix
# owner keys, those n keys (deepest first), then the job's field/value pairs.
# With placement on, the job goes to the offer stream of the worker `route` names, else to its
# class stream. Returns {entry id, stream} (the new entry, or the one already queued for the
# request: the marker holds both), or {length} when the class stream (with the offer stream)
# already holds the limit. A stream made here gets its consumer group at once (start id 0), so a
# worker reading a class it has not seen before misses nothing.
_ENQUEUE = (
    placement.ROUTE_FUNCTION
    + """
local existing = redis.call('GET', KEYS[1])
if existing then
  local tab = string.find(existing, '\t', 1, true)
  return {string.sub(existing, 1, tab - 1), string.sub(existing, tab + 1)}
end
local first_field = 10 + tonumber(ARGV[9])
local stream = KEYS[2]
if ARGV[5] == '1' then
  local worker = route(KEYS[4], ARGV[6], ARGV[7], ARGV[8], 10, first_field - 1)
  if worker then stream = ARGV[7] .. worker end
end
local length = redis.call('XLEN', KEYS[2])
if stream ~= KEYS[2] then length = length + redis.call('XLEN', stream) end
if length >= tonumber(ARGV[2]) then return {length} end
if redis.call('EXISTS', stream) == 0 then
  redis.call('XGROUP', 'CREATE', stream, ARGV[4], '0', 'MKSTREAM')
end
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[3])
local entry = redis.call('XADD', stream, '*', unpack(ARGV, first_field))
redis.call('SET', KEYS[1], entry .. '\t' .. stream, 'EX', ARGV[1])
return {entry, stream}
"""
)


@dataclass(frozen=True, slots=True)
class Enqueued:
    entry_id: str
    stream: str  # the class stream, or the offer stream of the worker the job was placed on


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
        priority=req.priority or 0,
        prefixes=" ".join(prefix_hashes(req)) if kind != "count" else "",
    )


def prefix_hashes(req: GenerationRequest) -> list[str]:
    """The request's prefix chain (`shared.placement`): what it shares with earlier requests."""
    if isinstance(req, ChatCompletionRequest):
        messages = [message.model_dump(exclude_none=True) for message in req.messages]
        tools = [tool.model_dump(exclude_none=True) for tool in req.tools] if req.tools else None
        return placement.chat_chain(req.model, messages, tools)
    prompt = req.prompt_value() if len(req.prompts()) == 1 else ""
    return placement.prompt_chain(req.model, prompt)


async def enqueue(
    redis: Redis, job: Job, max_queue: int, place: bool = False, min_replicas: int = 0, wait_ms: int = 0
) -> Enqueued:
    """XADD without MAXLEN (a queued job is never trimmed), at most once per request, unless the
    stream already holds `max_queue` entries (raises QueueFull); where it went.

    The limit is checked in the same script as the XADD, so it holds under any concurrency: waiting
    + pending is the stream's length, since workers XACK *and* XDEL a finished job in one script
    (see `shared.queue_stats`).

    `place`: offer the job to the worker holding its longest prefix with a lane free
    (`shared.placement`), decided in the same script: no round trip of its own.

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
    model = job.model
    owners = [keys.prefix_owner(model, h) for h in reversed(job.prefixes.split())] if place else []
    routing: list[str | int] = [int(place), keys.worker_heartbeat(""), keys.offer_stream(model, ""), model]
    routing += [len(owners), *owners]
    script_keys = [
        keys.enqueued_marker(job.id),
        keys.request_stream(model, job.priority),
        keys.priority_classes(model),
        keys.placement_counts(model),
    ]
    args: list[str | int] = [ttl_s, max_queue, job.priority, keys.CONSUMER_GROUP, *routing, *fields]
    script = redis.register_script(_ENQUEUE)
    if not min_replicas:
        return _enqueued(await script(keys=script_keys, args=args))
    async with redis.client() as pinned:  # WAIT confirms the writes of its own connection only
        enqueued = _enqueued(await script(keys=script_keys, args=args, client=pinned))
        confirmed = await pinned.wait(min_replicas, wait_ms)
    if confirmed < min_replicas:
        raise NoReplica(f"{confirmed} of {min_replicas} replica(s) confirmed the job within {wait_ms} ms")
    return enqueued


def _enqueued(reply: list[str]) -> Enqueued:
    if len(reply) == 1:
        raise QueueFull(int(reply[0]))
    return Enqueued(reply[0], reply[1])  # decode_responses=True: str


async def cancel(redis: Redis, request_id: str) -> None:
    """Tell workers to drop the request: a cancel key for the next step check, and a broadcast."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)
        pipe.publish(keys.CONTROL_CHANNEL, CancelMessage(id=request_id).model_dump_json())
        await pipe.execute()
