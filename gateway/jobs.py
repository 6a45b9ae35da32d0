"""Putting a job on a model's stream, and taking it back when the client is gone."""

from __future__ import annotations

import time
from collections.abc import Callable

from redis.asyncio import Redis

from shared import keys
from shared.openai_schema import ChatCompletionRequest, GenerationRequest
from shared.protocol import CANCEL_TTL_S, CancelMessage, Job, JobKind

ID_PREFIXES: dict[JobKind, str] = {"chat": "chatcmpl", "completion": "cmpl"}


def new_job(kind: JobKind, req: GenerationRequest, default_max_tokens: int, timeout_s: float,
            make_id: Callable[[str], str]) -> Job:
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
    )


async def enqueue(redis: Redis, job: Job) -> str:
    """XADD without MAXLEN: a queued job is never trimmed. Returns the entry id."""
    return await redis.xadd(keys.request_stream(job.model), job.to_fields())


async def cancel(redis: Redis, request_id: str) -> None:
    """Tell workers to drop the request: a cancel key for the next step check, and a broadcast."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)
        pipe.publish(keys.CONTROL_CHANNEL, CancelMessage(id=request_id).model_dump_json())
        await pipe.execute()
