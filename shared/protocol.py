"""What the gateway and the workers say to each other over Redis. Both sides import these.

A request's life, with the Redis names from `shared.keys`:

1. The gateway listens on `events_channel(id)` and only then XADDs a `Job` (`Job.to_fields()`)
   to `request_stream(model)` (it PSUBSCRIBEs once to a pattern matching every id it makes),
   at most once: a script adds the entry and `enqueued_marker(id)` (its entry id) together, and
   returns the marked id if the job is already in, so a retried command cannot queue it twice.
   The consumer group `CONSUMER_GROUP` is created with start id "0" (`XGROUP CREATE ... 0
   MKSTREAM`) by whichever side gets there first; BUSYGROUP is not an error.
   A job of priority p goes to `request_stream(model, p)` (p is added to `priority_classes(model)`),
   or, placed on a worker by its prefix, to `offer_stream(model, worker)`, from where the gateway
   moves it to its class stream if it is still unread after the offer wait (`shared.placement`).
2. A worker XREADGROUPs the job when it has a free lane (its offer stream and every class stream
   in one read), or, with every lane busy, from the streams of classes better than its worst
   running lane (the scheduler preempts that lane for it); `JobState` in `job_state(id)` is written
   with its first event (a reclaimer writes it when it claims the job).
   It re-validates `Job.body` with `shared.openai_schema` (no limits context) and reads:
   `to_sampling_params(req)` (max_tokens is always set by the gateway), `n` (one lane per choice
   or a lane with n streams: every event names its `choice`), chat `logprobs` / `top_logprobs`,
   completion `logprobs` (top-k count), `echo` and `prompt_logprobs` (the prompt's logprobs:
   `CompletionRequest.num_prompt_logprobs()`, sent in a delta of their own before the first token),
   `tools`, `chat_template_kwargs`,
   `reasoning_budget_tokens()`, and `CompletionRequest.prompt_value()`. A job already past its
   `deadline` gets an `ErrorEvent` with code `deadline_exceeded`.
3. Every event is written atomically (a Lua script, fenced on ownership; a batch of events is
   one script call), so the log, the channel and the state never disagree:
       RPUSH event_log(id) <json>; EXPIRE event_log(id) EVENT_LOG_TTL_S;
       PUBLISH events_channel(id) <json>; HSET job_state(id) worker, attempt, next_seq <seq+1>; EXPIRE ...
   `seq` starts at 0 and is contiguous per request *across attempts*, so LRANGE index == seq.
   Pub/sub is at-most-once: the gateway repairs a gap (or silence) with LRANGE on the log.
   A delta carries the tokens of one decode step or, when steps waited to be published, of
   several (merged while they waited: `worker.serving.step_delta`): readers must not count deltas as
   steps or tokens. An attempt's first delta carries `prompt_tokens` and `cached_tokens`.
4. Each choice ends with exactly one `FinalEvent`; an `ErrorEvent` ends the whole request.
   Afterwards the worker XACKs and XDELs the entry and DELs the job state (one transaction).
   The gateway never trims the stream, so unread jobs are never lost.
5. Client gone (or gateway deadline): the gateway SETs `cancel_key(id)` (EX CANCEL_TTL_S) and
   PUBLISHes a `CancelMessage` on `CONTROL_CHANNEL`. The worker drops the lane before its next
   step and cleans up as in 4; a final with finish_reason "cancelled" is optional (nobody waits).
   Gateway gone (killed): PUBLISH reports that no subscriber heard the job's events; after the
   worker's orphan timeout it cancels the job the same way.
6. Worker death: a reclaimer XAUTOCLAIMs the job (only if the owner's heartbeat has expired),
   takes attempt = `JobState.attempt` + 1 (the entry's fields are immutable), and resumes from
   prompt + the tokens of the deltas in the event log, continuing at `JobState.next_seq`. A stale attempt
   must not publish (fence on `JobState.attempt`). After `max_attempts` deliveries the job goes
   to `DEAD_LETTER_STREAM` and an `ErrorEvent` (code `dead_letter`) is published.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

EVENT_LOG_TTL_S = 600  # refreshed on every RPUSH, so it outlives any gap the gateway repairs
JOB_STATE_TTL_S = 600  # refreshed on every event
CANCEL_TTL_S = 600

# count: a chat body whose prompt is only counted; tokenize: a `shared.tokenizer_api.TokenizerJob`
JobKind = Literal["chat", "completion", "count", "tokenize"]
FinishReason = Literal["stop", "length", "tool_calls", "cancelled"]


class ErrorCode:
    """`ErrorEvent.code` values. The gateway maps them to HTTP statuses for non-streaming replies."""

    INVALID_REQUEST = "invalid_request"  # 400: e.g. a template the worker cannot render
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # 400: prompt + max_tokens > context
    DEADLINE_EXCEEDED = "deadline_exceeded"  # 504: the job's deadline passed before it finished
    DEAD_LETTER = "dead_letter"  # 500: too many deliveries, given up
    INTERNAL_ERROR = "internal_error"  # 500: anything else


# A Redis hash's field names: str with decode_responses, bytes without (redis-py types them both).
_Field = TypeVar("_Field", bound=bytes | str)


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Job(BaseModel):
    """One request stream entry. On the wire every field is a string (`to_fields`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str  # "chatcmpl-..." or "cmpl-..."
    model: str
    kind: JobKind
    body: str  # JSON of the validated request (ChatCompletionRequest / CompletionRequest)
    created: float  # unix s, when the gateway accepted it
    deadline: float  # unix s; past it the worker drops the job with DEADLINE_EXCEEDED
    attempt: int = 1  # 1 on first delivery; the reclaimer bumps it
    priority: int = 0  # the class (lower runs sooner): the stream it is on, and the lane's place in line
    prefixes: str = ""  # its prefix hashes, space-separated, shallowest first (`shared.placement`)

    def to_fields(self) -> dict[str, str]:
        return {name: str(value) for name, value in self.model_dump().items()}

    @classmethod
    def from_fields(cls, fields: Mapping[_Field, bytes | str]) -> Job:
        return cls.model_validate({_decode(k): _decode(v) for k, v in fields.items()})

    def request(self) -> dict[str, Any]:
        """The request body as a dict (validate it with the model from `shared.openai_schema`)."""
        body: dict[str, Any] = json.loads(self.body)  # a validated request's JSON: an object
        return body


class JobState(BaseModel):
    """The owning worker's progress; what a reclaimer resumes from.

    `job_state(id)` holds only who owns the job (worker, attempt) and `next_seq`, written with
    every event. What was emitted and which choices finished is read back from the event log on
    a claim (`from_fields(fields, log)`): the log holds every published event, in seq order, and is
    written in the same script as the state, so the two always agree. Writing the emitted tokens
    into the state with every event would cost O(tokens so far) per step: quadratic per request.
    """

    model_config = ConfigDict(extra="forbid")

    worker: str
    attempt: int
    emitted_token_ids: list[list[int]] = Field(default_factory=list)  # per choice, every token published
    finished_choices: list[int] = Field(default_factory=list)  # choices whose final is published
    next_seq: int = 0

    def to_fields(self) -> dict[str, str]:
        return {"worker": self.worker, "attempt": str(self.attempt), "next_seq": str(self.next_seq)}

    @classmethod
    def from_fields(cls, fields: Mapping[_Field, bytes | str], log: Sequence[bytes | str] = ()) -> JobState:
        """The state hash plus the job's event log (its first `next_seq` entries are replayed)."""
        raw = {_decode(k): _decode(v) for k, v in fields.items()}
        state = cls(worker=raw["worker"], attempt=int(raw["attempt"]), next_seq=int(raw.get("next_seq", 0)))
        for event in map(parse_event, log[: state.next_seq]):
            if isinstance(event, DeltaEvent):
                state.emitted_token_ids += [[] for _ in range(event.choice + 1 - len(state.emitted_token_ids))]
                state.emitted_token_ids[event.choice] += event.token_ids
            elif isinstance(event, FinalEvent):
                state.finished_choices.append(event.choice)
        return state


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(BaseModel):
    """One sampled token's logprob, in the shape of OpenAI chat `logprobs.content[i]`."""

    model_config = ConfigDict(extra="forbid")

    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """One prompt token's logprob given the tokens before it (the first token has none: logprob
    and rank None). `rank`: 1 for the most likely token. `top`: the most likely tokens, most
    likely first, their ids in `top_ids`."""

    model_config = ConfigDict(extra="forbid")

    token_id: int
    token: str
    logprob: float | None
    rank: int | None
    top_ids: list[int] = Field(default_factory=list)
    top: list[TopLogprob] = Field(default_factory=list)


class FunctionDelta(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    arguments: str | None = None  # a fragment; the client concatenates fragments


class ToolCallDelta(BaseModel):
    """An OpenAI streamed tool-call delta: the first one for an `index` carries id, type, name."""

    model_config = ConfigDict(extra="forbid")

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # prompt tokens served from the prefill cache, not computed again


class FinalStats(BaseModel):
    """Per-choice statistics. Known keys are typed; a worker may add more (they are kept)."""

    model_config = ConfigDict(extra="allow")

    speculation: str | None = None  # the worker's mode: auto, mtp, mtp-tree, tree, dflash, ngram, suffix, none
    target_forwards: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    # {source: {"drafts", "draft_tokens", "accepted_tokens"}}: the three above by draft source
    draft_sources: dict[str, dict[str, int]] = Field(default_factory=dict)
    queue_s: float | None = None  # job created -> worker picked it up
    prefill_s: float | None = None
    decode_s: float | None = None


class _EventBase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str  # the request id
    attempt: int
    seq: int  # 0, 1, 2, ... contiguous per request across attempts


class DeltaEvent(_EventBase):
    type: Literal["delta"] = "delta"
    choice: int = 0
    text: str = ""  # visible content
    reasoning: str = ""  # text between the think tags -> reasoning_content
    token_ids: list[int] = Field(default_factory=list)
    tool_calls: list[ToolCallDelta] = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one entry per token in token_ids, when asked
    # Every prompt token's, once per choice before its first token, when asked
    prompt_logprobs: list[PromptLogprob] | None = None
    # The prompt's size and the prefill cache's share of it, on an attempt's first delta:
    # Anthropic's message_start reports them before any text (the final event's usage has them too)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None


class FinalEvent(_EventBase):
    type: Literal["final"] = "final"
    choice: int = 0
    finish_reason: FinishReason
    stop_sequence: str | None = None  # the stop string that ended the text (finish_reason "stop")
    usage: Usage
    stats: FinalStats = Field(default_factory=FinalStats)
    result: dict[str, Any] | None = None  # a tokenize job's reply (shared.tokenizer_api)


class ErrorEvent(_EventBase):
    type: Literal["error"] = "error"
    message: str
    code: str = ErrorCode.INTERNAL_ERROR


Event = Annotated[DeltaEvent | FinalEvent | ErrorEvent, Field(discriminator="type")]
_EVENT = TypeAdapter(Event)


def merge_tool_calls(first: list[ToolCallDelta], second: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Argument fragments that continue the previous call are appended to it, as a client would:

    [{index 0, id, name, arguments '{"q'}] + [{index 0, arguments '": 1}'}]
    -> [{index 0, id, name, arguments '{"q": 1}'}]
    """
    calls = list(first)
    for call in second:
        previous = calls[-1] if calls else None
        if previous is not None and previous.index == call.index and _continues(call):
            calls[-1] = previous.model_copy(update={"function": _joined(previous.function, call.function)})
        else:
            calls.append(call)
    return calls


def _continues(call: ToolCallDelta) -> bool:
    return call.id is None and call.type is None and (call.function is None or call.function.name is None)


def _joined(first: FunctionDelta | None, second: FunctionDelta | None) -> FunctionDelta | None:
    if first is None or second is None:
        return first or second
    if first.arguments is None or second.arguments is None:
        return first.model_copy(update={"arguments": first.arguments or second.arguments})
    return first.model_copy(update={"arguments": first.arguments + second.arguments})


def parse_event(raw: str | bytes) -> DeltaEvent | FinalEvent | ErrorEvent:
    """One event from its JSON; raises pydantic.ValidationError on anything else."""
    return _EVENT.validate_json(raw)


def encode_event(event: DeltaEvent | FinalEvent | ErrorEvent) -> str:
    return event.model_dump_json()


class CancelMessage(BaseModel):
    """Published on `CONTROL_CHANNEL` when a request is cancelled (the cancel key is set too)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["cancel"] = "cancel"
    id: str


def parse_control(raw: str | bytes) -> CancelMessage:
    return CancelMessage.model_validate_json(raw)
