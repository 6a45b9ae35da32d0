"""Putting a job on a model's stream, and taking it back when the client is gone."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from redis.asyncio import Redis

from shared import keys, placement
from shared.openai_schema import ChatCompletionRequest, GenerationRequest
from shared.protocol import CANCEL_TTL_S, CancelMessage, Job, JobKind

ID_PREFIXES: dict[JobKind, str] = {"chat": "chatcmpl", "completion": "cmpl", "count": "count"}
MARKER_MARGIN_S = 60  # the marker outlives the job's deadline by this much

# KEYS: the stream the job goes to (its class stream, or a worker's offer stream), the request's
# enqueued marker, the class stream, the model's classes.  ARGV: the marker's ttl, the queue limit,
# the priority, the consumer group, then the job's field/value pairs.  Returns the entry id (the new
# one, or the first one if the job is already in), or {length} when the class stream (with the
# offer stream) already holds the limit. A stream made here gets its consumer group at once
# (start id 0), so a worker reading a class it has not seen before misses nothing.
_ENQUEUE = """
local existing = redis.call('GET', KEYS[2])
if existing then return existing end
local length = redis.call('XLEN', KEYS[3])
if KEYS[1] ~= KEYS[3] then length = length + redis.call('XLEN', KEYS[1]) end
if length >= tonumber(ARGV[2]) then return {length} end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[4], '0', 'MKSTREAM')
end
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[3])
local entry = redis.call('XADD', KEYS[1], '*', unpack(ARGV, 5))
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
    updates: dict[str, int | None] = {"max_tokens": req.requested_max_tokens() or default_max_tokens}
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


async def enqueue(redis: Redis, job: Job, max_queue: int, stream: str | None = None) -> str:
    """XADD without MAXLEN (a queued job is never trimmed), at most once per request, unless the
    stream already holds `max_queue` entries (raises QueueFull); returns the entry id.

    The limit is checked in the same script as the XADD, so it holds under any concurrency: waiting
    + pending is the stream's length, since workers XACK *and* XDEL a finished job in one script
    (see `shared.queue_stats`).

    `stream`: where the job goes (a worker's offer stream); by default its class stream.

    At most once because a client with retries on (redis-py's `Retry`; the gateway's pool has none
    today) resends a command whose reply was lost, to a connection reset or a socket timeout while
    Redis stalls: a plain XADD retried after it landed would queue the job twice, and two workers
    would run it and interleave their events. The script adds the entry and a marker holding its
    id in one step, so a retry finds the marker and returns the first id.
    """
    ttl_s = max(math.ceil(job.deadline - time.time()), 0) + MARKER_MARGIN_S
    fields = [part for name, value in job.to_fields().items() for part in (name, value)]
    class_stream = keys.request_stream(job.model, job.priority)
    reply = await redis.register_script(_ENQUEUE)(
        keys=[stream or class_stream, keys.enqueued_marker(job.id), class_stream, keys.priority_classes(job.model)],
        args=[ttl_s, max_queue, job.priority, keys.CONSUMER_GROUP, *fields],
    )
    if isinstance(reply, list):
        raise QueueFull(int(reply[0]))
    entry_id: str = reply  # decode_responses=True
    return entry_id


async def cancel(redis: Redis, request_id: str) -> None:
    """Tell workers to drop the request: a cancel key for the next step check, and a broadcast."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)
        pipe.publish(keys.CONTROL_CHANNEL, CancelMessage(id=request_id).model_dump_json())
        await pipe.execute()
