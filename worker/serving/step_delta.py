"""A decode step's output on its way to Redis: plain fields, merged in place while it waits.

The owner makes one per step of a lane; the outbox merges a job's next one into it while it is
still pending (`absorb`); the publisher turns it into the wire's `DeltaEvent` once, when its batch
goes out (`to_json`). Validating a pydantic event for every step and copying it on every merge cost
the owner ~15 µs of its ~58 µs of work per token (tiny model, model time excluded, alternating in
one process: docs/BENCHMARKS.md), on top of a ~2 ms step. A delta without tool calls or logprobs
(nearly every one) is encoded with no pydantic at all, to the same bytes.

    pending  StepDelta(seq 4, "Hel", ids [7])
    absorb   StepDelta(seq 5, "lo", ids [9])   -> True: pending is now seq 4, "Hello", ids [7, 9]

A merged delta says exactly what the two said, in order, at the first one's seq; so readers must
not count deltas as steps or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from json.encoder import encode_basestring

from shared.protocol import DeltaEvent, PromptLogprob, TokenLogprob, ToolCallDelta, encode_event, merge_tool_calls

# A JSON string as pydantic writes one: non-ASCII as it is, the same escapes (control characters,
# quote, backslash). The C function json's encoder itself calls.
_string = encode_basestring


@dataclass(slots=True)
class StepDelta:
    id: str  # the request id
    attempt: int
    seq: int
    choice: int = 0
    text: str = ""
    reasoning: str = ""
    token_ids: list[int] = field(default_factory=list)
    tool_calls: list[ToolCallDelta] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # one entry per token in token_ids, when asked
    prompt_logprobs: list[PromptLogprob] | None = None  # the prompt's, before the first token
    prompt_tokens: int | None = None  # the prompt's size, on an attempt's first delta

    def absorb(self, later: StepDelta) -> bool:
        """Append what `later` (the same job's next delta) says; False, and nothing changed, if the
        two cannot be one event: other choices or attempts, or logprobs in one and not the other
        (forced tokens carry none)."""
        if later.choice != self.choice or later.attempt != self.attempt:
            return False
        if (self.logprobs is None) != (later.logprobs is None) or later.prompt_logprobs is not None:
            return False
        self.text += later.text
        self.reasoning += later.reasoning
        self.token_ids += later.token_ids
        if self.prompt_tokens is None:
            self.prompt_tokens = later.prompt_tokens
        if later.tool_calls:
            self.tool_calls = merge_tool_calls(self.tool_calls, later.tool_calls)
        if self.logprobs is not None and later.logprobs is not None:
            self.logprobs += later.logprobs
        return True

    def event(self) -> DeltaEvent:
        return DeltaEvent(
            id=self.id,
            attempt=self.attempt,
            seq=self.seq,
            choice=self.choice,
            text=self.text,
            reasoning=self.reasoning,
            token_ids=self.token_ids,
            tool_calls=self.tool_calls,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            prompt_tokens=self.prompt_tokens,
        )

    def to_json(self) -> str:
        """The wire event's JSON, the same bytes as `encode_event(self.event())`. Without tool calls
        or logprobs it is written straight from the fields: in the owner's publish, after a model
        step has cooled the caches, validating and dumping the model cost ~1% of the step rate."""
        if (
            self.tool_calls
            or self.logprobs is not None
            or self.prompt_logprobs is not None
            or self.prompt_tokens is not None
        ):
            return encode_event(self.event())
        # Formatted, not json.dumps'd: with the caches cold after a model step, the encoder json
        # builds per call made this ~35 µs a batch; formatted it is ~14 (tiny model; docs/BENCHMARKS.md,
        # "Measurements behind the serving defaults")
        return (
            f'{{"id":{_string(self.id)},"attempt":{self.attempt},"seq":{self.seq},"type":"delta",'
            f'"choice":{self.choice},"text":{_string(self.text)},"reasoning":{_string(self.reasoning)},'
            f'"token_ids":[{",".join(map(str, self.token_ids))}],"tool_calls":[],"logprobs":null,'
            '"prompt_logprobs":null,"prompt_tokens":null}'
        )
