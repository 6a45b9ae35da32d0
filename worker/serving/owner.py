"""The owner thread: the one thread that touches the model. It runs the scheduler and turns lane
steps into protocol events.

The asyncio side talks to it through `inbox`, a `queue.SimpleQueue` (its `empty()`, asked before
every step, is one C call: 16 ns, against 290 ns for `Queue.empty()`'s Python-level lock). It carries
`StartJob`, `DropJob` and `StopOwner`. What the owner makes goes to its `sink` (the publisher,
`worker.redis_side.publisher`), in order: `put` queues `Publication`s and `JobDone`s, and `pump`, called
after every step, does the sink's I/O without waiting while there is a step to run. The inbox is
drained before every step, so a cancel that arrived is seen before the lane's next step. Each
decode step of a lane becomes one delta (a `StepDelta`, encoded as the wire's event when its batch
goes out; its token ids even when the text is still held back, so the job state always records
every emitted token) unless `put` merged it into the job's previous delta, still waiting to be
published (then that event carries both steps and the seq is not used); each choice ends with one
final event; an error event ends the whole request. A job's deltas up to and including its first
visible output are flagged `first_output`: the publisher never holds them back (TTFT), while
later ones may wait for the publish and stream intervals.

Held lanes. After its first visible output, a lane whose steps need nothing decided from their
text (no stop strings, no reasoning budget, no logprobs) is not put through its output every
step: its tokens are held, and go through the detokenizer and parsers together, as one delta,
when the sink is `due` to send (or the lane ends, or nothing else is left to run). The deltas
would wait in the outbox anyway; this way the text is made once a batch instead of once a step.
On the tiny CPU model that work between two steps also slowed the next step (colder caches);
with a free model the owner's own time per token went from ~21 to ~13 µs (`arbor bench owner
--free-model`, docs/BENCHMARKS.md). Held tokens are in `emitted` (usage counts them); a cancel
publishes them before its final; an error or a lost job drops them, as it drops the outbox.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

import tokenizers

from shared.protocol import (
    ErrorCode,
    ErrorEvent,
    FinalEvent,
    FinalStats,
    FinishReason,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    merge_tool_calls,
)
from worker.serving.handoff import BatchItem, Event, JobDone, JobRef, JobSpec, Publication
from worker.serving.lane_output import LaneDelta, LaneOutput, format_logprobs, format_prompt_logprobs
from worker.serving.model_stepper import LaneStart, LaneState, ModelStepper
from worker.serving.scheduler import (
    LaneKey,
    LaneRequest,
    LaneTooLarge,
    Scheduler,
    SchedulerConfig,
    StepKind,
    StepResult,
)
from worker.serving.step_delta import StepDelta

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # how long an idle owner blocks on its inbox before looking again
SINK_WAIT_S = 0.01  # how long an idle owner with events in flight waits on the sink before looking again


@dataclass(slots=True)
class StartJob:
    spec: JobSpec
    ref: JobRef


@dataclass(slots=True)
class DropJob:
    request_id: str
    cancelled: bool  # True: the client cancelled (final "cancelled" + ack); False: the job is no longer ours


@dataclass(slots=True)
class StopOwner:
    pass


class Sink(Protocol):
    def put(self, item: BatchItem) -> bool:
        """Queue an item; True if it was merged into a pending delta (its seq is not used)."""

    def due(self) -> bool:
        """An item put now would go out at the next `pump` (nothing urgent needs to be waiting)."""

    def pump(self, wait_s: float) -> bool:
        """Do what I/O is ready, waiting up to `wait_s`; True while something is unsent or unanswered."""


class Capacity:
    """Lanes held by accepted jobs (waiting or running). The reader holds, the owner releases."""

    def __init__(self, max_lanes: int):
        self.max_lanes = max_lanes
        self._held = 0
        self._lock = threading.Lock()
        self.num_waiting = 0  # lanes accepted but not yet started (memory-bound); set by the owner
        # The lowest class (largest priority) running, None with none: a job of a better class
        # may be read with every lane busy, to preempt one of these. Set by the owner.
        self.worst_running: int | None = None
        self.waiting_by_class: dict[int, int] = {}  # waiting lanes per priority; set by the owner
        self.preemptions_by_class: dict[int, int] = {}  # lanes preempted per priority; the scheduler's

    @property
    def held(self) -> int:
        return self._held

    def free(self) -> int:
        """Lanes a new job may take now; 0 while accepted lanes still wait for memory."""
        with self._lock:
            return 0 if self.num_waiting else max(self.max_lanes - self._held, 0)

    def hold(self, num: int) -> None:
        with self._lock:
            self._held += num

    def release(self, num: int) -> None:
        with self._lock:
            self._held -= num
            assert self._held >= 0, self._held


@dataclass(slots=True, frozen=True)
class OwnerConfig:
    worker_id: str
    speculation: str
    max_lanes: int
    max_kv_bytes: int  # for lanes whose memory is fixed at start (hybrid models)
    max_batch_tokens: int  # rows of one step


@dataclass(slots=True)
class _Job:
    spec: JobSpec
    ref: JobRef
    outputs: dict[int, LaneOutput]  # open choices only
    emitted: list[list[int]]  # per choice, every token emitted, held ones and resumed ones included
    finished: list[int]  # choices whose final event went out
    next_seq: int
    shown: bool = False  # a delta with visible output (text, reasoning, tool calls) was queued
    # Its steps need no per-step decision from their text: no stop strings, no reasoning budget, no
    # single-call limit (logprobs, kept per step, are checked per lane). Such a lane's tokens may be
    # held (`Owner`).
    holdable: bool = False


class Owner:
    def __init__(
        self,
        stepper: ModelStepper,
        tokenizer: tokenizers.Tokenizer,
        config: OwnerConfig,
        capacity: Capacity,
        sink: Sink,
    ):
        self.stepper = stepper
        self.tokenizer = tokenizer
        self.config = config
        self.capacity = capacity
        self.sink = sink
        self.inbox: queue.SimpleQueue[StartJob | DropJob | StopOwner] = queue.SimpleQueue()
        self.scheduler = scheduler = Scheduler(
            stepper,
            SchedulerConfig(config.max_lanes, config.max_kv_bytes, config.max_batch_tokens, stepper.num_blocks),
            self._is_cancelled,
        )
        capacity.preemptions_by_class = scheduler.preemptions_by_class  # the same dict, read by beats
        self._jobs: dict[str, _Job] = {}
        self._cancelled: set[str] = set()
        self._held: dict[LaneKey, list[int]] = {}  # tokens emitted, not yet through their lane's output

    def run(self) -> None:
        """The owner loop; returns on StopOwner (dropping whatever is left, unacknowledged)."""
        sending = False
        while self._receive(block=self.scheduler.idle and not sending):
            for result in self.scheduler.step():
                self._handle(result)
            if self._held and (self.scheduler.idle or self.sink.due()):
                self._release_held()
            self._report_classes()
            sending = self.sink.pump(SINK_WAIT_S if self.scheduler.idle else 0.0)
        for request_id in list(self._jobs):
            self._drop(self._jobs[request_id], cancelled=False)

    def _report_classes(self) -> None:
        scheduler, capacity = self.scheduler, self.capacity
        capacity.num_waiting = scheduler.num_waiting
        capacity.worst_running = scheduler.worst_running_priority
        if scheduler.num_waiting or capacity.waiting_by_class:
            capacity.waiting_by_class = scheduler.waiting_by_class()

    def _receive(self, block: bool) -> bool:
        if not block and self.inbox.empty():
            return True  # the common case between steps: cheaper than get_nowait raising Empty
        try:
            message = self.inbox.get(timeout=IDLE_WAIT_S) if block else self.inbox.get_nowait()
            while True:
                if isinstance(message, StopOwner):
                    return False
                self._dispatch(message)
                message = self.inbox.get_nowait()
        except queue.Empty:
            return True

    def _dispatch(self, message: StartJob | DropJob) -> None:
        if isinstance(message, StartJob):
            self._start(message.spec, message.ref)
        elif message.request_id in self._jobs:
            if message.cancelled:
                self._cancelled.add(message.request_id)  # dropped before its next step
            else:
                self._drop(self._jobs[message.request_id], cancelled=False)

    def _is_cancelled(self, key: LaneKey) -> bool:
        return key[0] in self._cancelled

    # -- starting ---------------------------------------------------------------------------

    def _start(self, spec: JobSpec, ref: JobRef) -> None:
        resume = spec.resume
        finished = sorted(set(resume.finished_choices))
        output = spec.output
        job = _Job(
            spec,
            ref,
            {},
            [spec.resumed_ids(c) for c in range(spec.n)],
            finished,
            resume.next_seq,
            holdable=not output.stop
            and not output.single_tool_call
            and (output.reasoning is None or output.reasoning.budget is None),
        )
        self._jobs[spec.request_id] = job
        self.capacity.release(len(finished))  # the reader held n lanes; finished choices need none
        for choice in range(spec.n):
            if choice not in finished:
                job.outputs[choice] = self._replayed_output(job, choice)
        for choice in [c for c, output in job.outputs.items() if output.stopped]:
            self._finish_stopped_replay(job, choice)  # the earlier attempt died between its last delta and final
        stepper, num_prompt, max_tokens = self.stepper, len(spec.prompt_ids), spec.params.max_tokens
        kv_bytes = stepper.kv_bytes(num_prompt, max_tokens)
        max_blocks = stepper.max_blocks(num_prompt, max_tokens)
        try:
            for choice in job.outputs:
                num_blocks = stepper.blocks_to_admit(num_prompt + len(job.emitted[choice]))
                start = LaneStart(
                    f"{spec.request_id}/{choice}",
                    spec.prompt_ids,
                    spec.params,
                    job.emitted[choice],
                    spec.output.num_logprobs,
                    spec.output.num_prompt_logprobs,
                )
                key = (spec.request_id, choice)
                self.scheduler.submit(
                    LaneRequest(key, kv_bytes, spec.deadline, start, num_blocks, max_blocks, spec.priority)
                )
        except LaneTooLarge as error:
            self._fail(job, ErrorCode.CONTEXT_LENGTH_EXCEEDED, str(error))
            return
        self._done_if_finished(job)

    def _finish_stopped_replay(self, job: _Job, choice: int) -> None:
        output = job.outputs.pop(choice)
        job.finished.append(choice)
        # stopped by a stop string, or by the one call allowed
        reason: FinishReason = "tool_calls" if output.made_tool_calls else "stop"
        self._publish(
            job,
            FinalEvent(
                id=job.spec.request_id,
                attempt=job.ref.attempt,
                seq=job.next_seq,
                choice=choice,
                finish_reason=reason,
                stop_sequence=output.stop_sequence if reason == "stop" else None,
                usage=self._usage(job, choice),
                stats=FinalStats(speculation=self.config.speculation),
            ),
        )
        self.capacity.release(1)

    def _replayed_output(self, job: _Job, choice: int) -> LaneOutput:
        output = LaneOutput(self.tokenizer, job.spec.output, job.spec.prompt_ids)
        output.add(job.emitted[choice])  # published by an earlier attempt: replayed, not sent again
        return output

    # -- steps ------------------------------------------------------------------------------

    def _handle(self, result: StepResult) -> None:
        job = self._jobs.get(result.key[0])
        if job is None:  # a lane of a job already torn down (cannot happen: teardown retires lanes)
            self.scheduler.retire(result.key)
            return
        choice = result.key[1]
        match result.kind:
            case StepKind.PREFILL:
                self._send_prompt_logprobs(job, choice, result.state)
                self._force_if_spent(job, choice, result.state)
            case StepKind.DECODE:
                self._send_prompt_logprobs(job, choice, result.state)
                self._on_tokens(job, choice, result.state, result.token_ids)
            case StepKind.CANCELLED:
                self._drop(job, cancelled=True)
            case StepKind.EXPIRED:
                self._fail(job, ErrorCode.DEADLINE_EXCEEDED, f"request {job.spec.request_id} passed its deadline")
            case StepKind.FAILED:
                log.error("lane %s failed", result.key, exc_info=result.error)
                self._fail(job, ErrorCode.INTERNAL_ERROR, f"{type(result.error).__name__}: {result.error}")

    def _send_prompt_logprobs(self, job: _Job, choice: int, state: LaneState) -> None:
        """Once its prefill scored the whole prompt: one delta with them (and echo's text), before
        any token. A resumed lane sends them again (the gateway keeps the first it hears)."""
        if job.spec.output.num_prompt_logprobs is None or state.prompt_logprobs_sent:
            return
        prompt = state.sequence.prompt_logprobs
        if prompt is None or not prompt.complete:
            return
        state.prompt_logprobs_sent = True
        spec = job.spec
        delta = StepDelta(spec.request_id, job.ref.attempt, job.next_seq, choice, job.outputs[choice].take_echo())
        delta.prompt_logprobs = format_prompt_logprobs(self.tokenizer, spec.prompt_ids[0], prompt)
        self._publish(job, delta, first_output=True)

    def _on_tokens(self, job: _Job, choice: int, state: LaneState, token_ids: list[int]) -> None:
        job.emitted[choice].extend(token_ids)
        key = (job.spec.request_id, choice)
        if job.shown and job.holdable and not state.finished and state.num_logprobs is None:
            self._held.setdefault(key, []).extend(token_ids)  # through the output when the sink is due
            return
        held = self._held.pop(key, None)
        if held:
            token_ids = held + token_ids
        output = job.outputs[choice]
        delta = output.add(token_ids)
        if output.stopped:
            self.stepper.stop(state)
        logprobs = format_logprobs(self.tokenizer, state.logprobs) if state.num_logprobs is not None else None
        if not state.finished:
            self._publish_delta(job, choice, delta, token_ids, logprobs)
            self._force_if_spent(job, choice, state)
            return
        delta.extend(output.finish())
        self._publish_delta(job, choice, delta, token_ids, logprobs)
        self._finish_choice(job, choice, state)

    def _release_held(self) -> None:
        """Held tokens through their lanes' outputs, one delta per lane, just before the sink sends."""
        held, self._held = self._held, {}
        for (request_id, choice), token_ids in held.items():
            self._release_lane(self._jobs[request_id], choice, token_ids)

    def _release_lane(self, job: _Job, choice: int, token_ids: list[int]) -> None:
        self._publish_delta(job, choice, job.outputs[choice].add(token_ids), token_ids, None)

    def _force_if_spent(self, job: _Job, choice: int, state: LaneState) -> None:
        """Reasoning budget spent: append the close tag to the sequence and publish its tokens."""
        output = job.outputs[choice]
        forced = [] if state.finished else output.tokens_to_force()
        if not forced:
            return
        forced = self.stepper.force_tokens(state, forced)
        delta = output.add(forced)
        job.emitted[choice].extend(forced)
        if state.finished:
            delta.extend(output.finish())
        self._publish_delta(job, choice, delta, forced, None)
        if state.finished:
            self._finish_choice(job, choice, state)

    # -- ending -----------------------------------------------------------------------------

    def _finish_choice(self, job: _Job, choice: int, state: LaneState) -> None:
        output = job.outputs.pop(choice)
        reason: FinishReason = state.finish_reason or "stop"
        if reason == "stop" and output.made_tool_calls:
            reason = "tool_calls"
        job.finished.append(choice)
        self._publish(
            job,
            FinalEvent(
                id=job.spec.request_id,
                attempt=job.ref.attempt,
                seq=job.next_seq,
                choice=choice,
                finish_reason=reason,
                stop_sequence=output.stop_sequence if reason == "stop" else None,
                usage=self._usage(job, choice, state.prefix_tokens),
                stats=self._stats(job, state),
            ),
        )
        self._retire(job, choice)
        self._done_if_finished(job)

    def _drop(self, job: _Job, cancelled: bool) -> None:
        """Cancelled: a "cancelled" final per open choice, then done. Lost: stop silently."""
        for choice in sorted(job.outputs):
            held = self._held.pop((job.spec.request_id, choice), None)
            if held and cancelled:
                self._release_lane(job, choice, held)  # emitted before the cancel: the log keeps them
            if cancelled:
                job.finished.append(choice)
                self._publish(
                    job,
                    FinalEvent(
                        id=job.spec.request_id,
                        attempt=job.ref.attempt,
                        seq=job.next_seq,
                        choice=choice,
                        finish_reason="cancelled",
                        usage=self._usage(job, choice),
                    ),
                )
            self._retire(job, choice)
        job.outputs.clear()
        self._end(job, done=cancelled)

    def _fail(self, job: _Job, code: str, message: str) -> None:
        self._publish(
            job,
            ErrorEvent(id=job.spec.request_id, attempt=job.ref.attempt, seq=job.next_seq, message=message, code=code),
        )
        for choice in list(job.outputs):
            self._retire(job, choice)
        job.outputs.clear()
        self._end(job, done=True)

    def _retire(self, job: _Job, choice: int) -> None:
        self._held.pop((job.spec.request_id, choice), None)  # an error ends the request: they go unsent
        self.scheduler.retire((job.spec.request_id, choice))
        self.capacity.release(1)

    def _done_if_finished(self, job: _Job) -> None:
        if not job.outputs and job.spec.request_id in self._jobs:
            self._end(job, done=True)

    def _end(self, job: _Job, done: bool) -> None:
        self._jobs.pop(job.spec.request_id, None)
        self._cancelled.discard(job.spec.request_id)
        if done:
            self.sink.put(JobDone(job.ref))

    # -- events -----------------------------------------------------------------------------

    def _publish_delta(
        self, job: _Job, choice: int, delta: LaneDelta, token_ids: list[int], logprobs: list[TokenLogprob] | None
    ) -> None:
        if not token_ids and delta.empty:
            return
        first_output = not job.shown  # up to the first visible output, nothing may wait (TTFT)
        job.shown = job.shown or not delta.empty
        # A step that emitted several tokens of one call says so in one entry per call index (the
        # openai SDK and agent frameworks merge deltas by index and break on repeats in a chunk).
        tool_calls = (
            merge_tool_calls([], [ToolCallDelta.model_validate(call) for call in delta.tool_calls])
            if delta.tool_calls
            else []
        )
        self._publish(
            job,
            StepDelta(
                job.spec.request_id,
                job.ref.attempt,
                job.next_seq,
                choice,
                delta.text,
                delta.reasoning,
                list(token_ids),
                tool_calls,
                logprobs,
            ),
            first_output,
        )

    def _publish(self, job: _Job, event: Event | StepDelta, first_output: bool = False) -> None:
        if not self.sink.put(Publication(job.ref, event, first_output)):
            job.next_seq += 1  # queued as its own event (True: merged into the previous delta)

    def _usage(self, job: _Job, choice: int, prefix_tokens: int = 0) -> Usage:
        """`prefix_tokens`: reused from the prefill cache (a resumed lane's prefix may run into the
        tokens it had emitted: only the prompt's count)."""
        num_prompt = len(job.spec.prompt_ids)
        return Usage(
            prompt_tokens=num_prompt,
            completion_tokens=len(job.emitted[choice]),
            cached_tokens=min(prefix_tokens, num_prompt),
        )

    def _stats(self, job: _Job, state: LaneState) -> FinalStats:
        stats, spec = state.stats, job.spec
        return FinalStats(
            speculation=self.config.speculation,
            target_forwards=stats.target_forwards,
            drafts=stats.drafts,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            draft_sources={source: counts.to_dict() for source, counts in stats.by_source.items()},
            queue_s=round(max(spec.picked_at - spec.created, 0.0), 6),
            prefill_s=round(stats.prefill_s, 6),
            decode_s=round(stats.decode_s, 6),
            prefix_cache_tokens=state.prefix_tokens,
            tokens_per_forward=round(stats.tokens_per_forward, 4),
            worker_id=self.config.worker_id,
        )
