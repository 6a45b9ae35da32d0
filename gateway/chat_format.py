"""Protocol events -> chat.completion.chunk objects (streaming) or one chat.completion (not).

Stream order, as OpenAI sends it: a role chunk per choice (delta {"role": "assistant",
"content": ""}), content / reasoning_content / tool_calls deltas, one finish chunk per choice
(delta {}), then, with stream_options.include_usage, a usage chunk with choices [] (every other
chunk then carries "usage": null).
"""

from __future__ import annotations

from gateway.accumulate import ChoiceState, Outcomes
from gateway.completion_bodies import (
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatMessage,
    ChunkChoice,
    DeltaMessage,
    UsageInfo,
)
from gateway.speculation_usage import usage_of
from shared.openai_schema import ChatCompletionRequest
from shared.protocol import DeltaEvent, FinalEvent, TokenLogprob, ToolCallDelta


class ChatFormat:
    def __init__(self, request_id: str, created: int, req: ChatCompletionRequest) -> None:
        self._id = request_id
        self._created = created
        self._model = req.model
        self._num_choices = req.n
        self._include_usage = req.include_usage
        self._speculation_stats = req.include_speculation_stats
        self._want_logprobs = req.logprobs

    def opening(self) -> list[ChatCompletionChunk]:
        delta = DeltaMessage(role="assistant", content="")
        return [
            self._chunk([ChunkChoice(index=i, delta=delta, logprobs=None, finish_reason=None)])
            for i in range(self._num_choices)
        ]

    def chunk(self, event: DeltaEvent | FinalEvent) -> ChatCompletionChunk | None:
        if isinstance(event, FinalEvent):
            choice = ChunkChoice(
                index=event.choice, delta=DeltaMessage(), logprobs=None, finish_reason=event.finish_reason
            )
            return self._chunk([choice])
        delta = _delta(event)
        logprobs = self._logprobs(event.logprobs)
        if not delta.model_fields_set and logprobs is None:
            return None  # e.g. tokens of a think tag: nothing for the client
        return self._chunk([ChunkChoice(index=event.choice, delta=delta, logprobs=logprobs, finish_reason=None)])

    def usage(self, outcome: Outcomes) -> UsageInfo:
        return usage_of(outcome, self._speculation_stats)

    def usage_chunk(self, usage: UsageInfo) -> ChatCompletionChunk:
        return self._chunk([], usage)

    def body(self, outcome: Outcomes) -> ChatCompletion:
        choices = [self._choice(i, state) for i, state in enumerate(outcome.choices)]
        return ChatCompletion(
            id=self._id,
            object="chat.completion",
            created=self._created,
            model=self._model,
            choices=choices,
            usage=self.usage(outcome),
        )

    def _chunk(self, choices: list[ChunkChoice], usage: UsageInfo | None = None) -> ChatCompletionChunk:
        chunk = ChatCompletionChunk(
            id=self._id,
            object="chat.completion.chunk",
            created=self._created,
            model=self._model,
            choices=choices,
        )
        if self._include_usage:
            chunk.usage = usage  # assignment marks it set, so null is sent too
        return chunk

    def _logprobs(self, entries: list[TokenLogprob] | None) -> ChatLogprobs | None:
        return ChatLogprobs(content=entries) if self._want_logprobs and entries else None

    def _choice(self, index: int, state: ChoiceState) -> ChatChoice:
        tool_calls = state.tool_calls()
        text = "".join(state.text)
        message = ChatMessage(role="assistant", content=text if text or not tool_calls else None)
        reasoning = "".join(state.reasoning)
        if reasoning:
            message.reasoning_content = reasoning
        if tool_calls:
            message.tool_calls = tool_calls
        logprobs = ChatLogprobs(content=state.logprobs) if self._want_logprobs else None
        return ChatChoice(index=index, message=message, logprobs=logprobs, finish_reason=state.finish_reason)


def _delta(event: DeltaEvent) -> DeltaMessage:
    delta = DeltaMessage()
    if event.text:
        delta.content = event.text
    if event.reasoning:
        delta.reasoning_content = event.reasoning
    if event.tool_calls:
        # Re-validated without nulls, so exclude_unset drops what this fragment does not carry.
        delta.tool_calls = [ToolCallDelta.model_validate(c.model_dump(exclude_none=True)) for c in event.tool_calls]
    return delta
