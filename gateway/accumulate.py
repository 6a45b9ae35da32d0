"""What a request produced so far, per choice: text, reasoning, tool calls, logprobs, finish.

Tool-call deltas merge by `index`: the first delta of a call brings id, type and name; later
ones append argument fragments, exactly as an OpenAI client reassembles a stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.completion_bodies import PromptTokensDetails, UsageInfo
from shared.openai_messages import ToolCall, ToolCallFunction
from shared.protocol import DeltaEvent, FinalEvent, FinalStats, PromptLogprob, TokenLogprob, ToolCallDelta


@dataclass(slots=True)
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def merge(self, delta: ToolCallDelta) -> None:
        self.id = delta.id or self.id
        if delta.function is not None:
            self.name = delta.function.name or self.name
            self.arguments.append(delta.function.arguments or "")

    def tool_call(self) -> ToolCall:
        function = ToolCallFunction(name=self.name, arguments="".join(self.arguments))
        return ToolCall(id=self.id, type="function", function=function)


@dataclass(slots=True)
class ChoiceState:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprob] | None = None  # the first heard (a resumed job sends them again)
    finish_reason: str | None = None
    stop_sequence: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    stats: FinalStats | None = None  # the worker's, from the final event
    result: dict[str, Any] | None = None  # a tokenize job's reply

    def add_delta(self, event: DeltaEvent) -> None:
        self.text.append(event.text)
        self.reasoning.append(event.reasoning)
        for delta in event.tool_calls:
            self.calls.setdefault(delta.index, _PartialCall()).merge(delta)
        self.logprobs.extend(event.logprobs or [])
        if self.prompt_logprobs is None:
            self.prompt_logprobs = event.prompt_logprobs

    def add_final(self, event: FinalEvent) -> None:
        self.finish_reason = event.finish_reason
        self.stop_sequence = event.stop_sequence
        self.prompt_tokens = event.usage.prompt_tokens
        self.completion_tokens = event.usage.completion_tokens
        self.cached_tokens = event.usage.cached_tokens
        self.stats = event.stats
        self.result = event.result

    def tool_calls(self) -> list[ToolCall]:
        return [self.calls[index].tool_call() for index in sorted(self.calls)]


class Outcome:
    def __init__(self, num_choices: int) -> None:
        self.choices = [ChoiceState() for _ in range(num_choices)]

    def add(self, event: DeltaEvent | FinalEvent) -> None:
        state = self.choices[event.choice]
        if isinstance(event, DeltaEvent):
            state.add_delta(event)
        else:
            state.add_final(event)

    def usage(self) -> UsageInfo:
        """The prompt is counted once (every choice shares it); completions are summed."""
        return usage_info(self.choices)


def usage_info(choices: list[ChoiceState]) -> UsageInfo:
    """The prompt is counted once per prompt (its choices share it, and its cache hit: the least
    any of them reused); completions are summed."""
    prompt = max(state.prompt_tokens for state in choices)
    completion = sum(state.completion_tokens for state in choices)
    details = PromptTokensDetails(cached_tokens=min(state.cached_tokens for state in choices))
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=details,
    )


class Outcomes(Protocol):
    """What a reply body is made from: one job's `Outcome`, or a prompt batch's (`gateway.batch`)."""

    @property
    def choices(self) -> list[ChoiceState]: ...

    def usage(self) -> UsageInfo: ...
