"""Stream entries -> running jobs, or -> an error event (and maybe a dead letter) when they cannot run.

For each entry read or reclaimed: parse it (malformed: poison), take over its job state (which
also says which delivery this is; an entry read new with XREADGROUP `>` is its first delivery, has
no state yet and needs no claim: the first publish writes the state, fenced like every publish),
then refuse it if it was delivered too often (dead letter),
passed its deadline, or was cancelled before it started; otherwise prepare it (template,
tokenizer, sampling; off the event loop if the body is long or may carry a structured output,
whose grammar is compiled then) and hand it to the owner thread.

A job of kind "count" (`/v1/messages/count_tokens`) ends here: once its prompt is rendered and
tokenized, one final event carries the count and the job is done, never reaching the owner. So
does a "tokenize" job (/tokenize, /detokenize, /tokenizer_info): its final event's `result` is the
endpoint's reply (`worker.redis_side.tokenizer_job`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import RedisError

from shared.placement import PREFIX_TTL_S
from shared.protocol import ErrorCode, ErrorEvent, FinalEvent, Job, JobState, Usage
from worker.redis_side import tokenizer_job
from worker.redis_side.jobs import JobRejected, PoisonJob, build_spec, parse_job
from worker.redis_side.redis_io import Claim, PublishResult, RedisIO, dead_letter_fields
from worker.serving.handoff import JobRef, JobSpec, Publication
from worker.serving_model import ServingModel

log = logging.getLogger(__name__)

# A body up to this size is prepared on the event loop (a short chat: well under a millisecond);
# a longer one in a thread, so the loop keeps beating and hearing cancels. The hop to a thread and
# back is on every request's way to its first token.
INLINE_PREPARE_BYTES = 8192
# A body naming any of these may carry a constraint, whose grammar is compiled as it is prepared.
STRUCTURED_OUTPUT_MARKS = ('"response_format"', '"structured_outputs"', '"guided_', '"tool_choice"')


@dataclass(slots=True)
class Intake:
    io: RedisIO
    stream: str
    max_attempts: int
    max_lanes: int
    hand_over: Callable[[JobSpec, JobRef], None]  # to the owner thread
    served: ServingModel | None = None  # set once the model is loaded

    async def accept(
        self, entry_id: str, fields: dict[str, str], first_delivery: bool = False, stream: str | None = None
    ) -> None:
        """`first_delivery`: read new (XREADGROUP `>`), so delivered once, to us, with no state yet;
        no claim round trip on the way to its first token (a cancel sent before is seen when the
        service reads the job's cancel key, just after handing it over). `stream`: where the entry
        is (a class stream or an offer stream), by default the model's priority-0 stream."""
        stream = stream or self.stream
        try:
            job = parse_job(fields)
        except PoisonJob as error:
            await self._poison(stream, entry_id, fields, error)
            return
        if first_delivery:
            claimed: Claim | None = Claim(1, JobState(worker=self.io.worker_id, attempt=1), False)
        else:
            claimed = await self.io.claim(stream, entry_id, job.id)
        if claimed is None:
            return  # taken by another worker between read and claim
        attempt, state = claimed.attempt, claimed.state
        ref = JobRef(job.id, stream, entry_id, attempt)
        if attempt > self.max_attempts:
            message = f"request {job.id} was given up after {attempt - 1} deliveries"
            await self._end_with_error(ref, state, ErrorCode.DEAD_LETTER, message, dead_letter=fields)
        elif time.time() > job.deadline:
            message = f"request {job.id} passed its deadline before it started"
            await self._end_with_error(ref, state, ErrorCode.DEADLINE_EXCEEDED, message)
        elif claimed.cancelled:
            await self.io.complete(ref)  # the client left before we started
        else:
            await self._prepare(job, ref, state, fields)

    async def _prepare(self, job: Job, ref: JobRef, state: JobState, fields: dict[str, str]) -> None:
        assert self.served is not None
        args = (job, ref.entry_id, ref.attempt, state, self.served, self.max_lanes)
        try:
            if job.kind == "tokenize":
                result = await asyncio.to_thread(tokenizer_job.answer, job, self.served)
                await self._final(ref, state, Usage(prompt_tokens=0, completion_tokens=0), result)
                return
            off_loop = prepare_off_loop(job, self.served)
            spec = await asyncio.to_thread(build_spec, *args) if off_loop else build_spec(*args)
        except PoisonJob as error:
            await self._end_with_error(ref, state, error.code, str(error), dead_letter=fields)
            return
        except JobRejected as error:
            await self._end_with_error(ref, state, error.code, str(error))
            return
        except Exception as error:  # e.g. a tokenizer failure: this job fails, the worker goes on
            log.exception("preparing job %s failed", job.id)
            message = f"{type(error).__name__}: {error}"
            await self._end_with_error(ref, state, ErrorCode.INTERNAL_ERROR, message, dead_letter=fields)
            return
        if spec.kind == "count":
            await self._final(ref, state, Usage(prompt_tokens=len(spec.prompt_ids), completion_tokens=0))
            return
        self.hand_over(spec, ref)
        if job.prefixes:
            await self._record_prefixes(job)

    async def _record_prefixes(self, job: Job) -> None:
        """After the hand-over (off the first token's path): the next turn of this conversation
        is placed here. A lost record only costs that placement."""
        try:
            await self.io.record_prefixes(job.model, job.prefixes.split(), PREFIX_TTL_S)
        except (RedisError, OSError) as error:
            log.warning("could not record the prefixes of %s: %s", job.id, error)

    async def _final(self, ref: JobRef, state: JobState, usage: Usage, result: dict[str, Any] | None = None) -> None:
        """The one event of a job answered here (count, tokenize), then done."""
        event = FinalEvent(
            id=ref.request_id, attempt=ref.attempt, seq=state.next_seq, finish_reason="stop", usage=usage, result=result
        )
        if (await self.io.publish([Publication(ref, event)]))[0] is not PublishResult.FENCED:
            await self.io.complete(ref)

    async def _end_with_error(
        self, ref: JobRef, state: JobState, code: str, message: str, dead_letter: dict[str, str] | None = None
    ) -> None:
        event = ErrorEvent(id=ref.request_id, attempt=ref.attempt, seq=state.next_seq, message=message, code=code)
        publication = Publication(ref, event)
        if (await self.io.publish([publication]))[0] is PublishResult.FENCED:
            return
        letter = None
        if dead_letter is not None:
            letter = dead_letter_fields(dead_letter, ref.stream, ref.entry_id, message, self.io.worker_id)
        await self.io.complete(ref, letter)
        log.warning("job %s ended with %s: %s", ref.request_id, code, message)

    async def _poison(self, stream: str, entry_id: str, fields: dict[str, str], error: PoisonJob) -> None:
        log.warning("poison entry %s: %s", entry_id, error)
        if error.request_id is not None:
            claimed = await self.io.claim(stream, entry_id, error.request_id)
            if claimed is not None:
                ref = JobRef(error.request_id, stream, entry_id, claimed.attempt)
                await self._end_with_error(ref, claimed.state, error.code, str(error), dead_letter=fields)
                return
        await self.io.dead_letter_unowned(stream, entry_id, fields, str(error))


def prepare_off_loop(job: Job, served: ServingModel) -> bool:
    """A long body, or one that may constrain its output, whose preparation compiles a grammar
    (and, the first time, reads the tokenizer: ~0.25 s for 49k tokens): in a thread. (The body is
    only looked at, not parsed: a request that merely names tool_choice goes to a thread too,
    which costs it ~0.1 ms.)"""
    return len(job.body) > INLINE_PREPARE_BYTES or any(mark in job.body for mark in STRUCTURED_OUTPUT_MARKS)
