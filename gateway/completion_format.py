"""Protocol events -> text_completion objects, streamed chunk by chunk or as one body.

Legacy completions have no role chunk and no reasoning; logprobs use the old parallel-list shape
(tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset).
"""

from __future__ import annotations

from gateway.accumulate import ChoiceState, Outcomes
from gateway.openai_responses import Completion, CompletionChoice, CompletionLogprobs, UsageInfo
from gateway.speculation_usage import usage_of
from shared.openai_schema import CompletionRequest
from shared.protocol import DeltaEvent, FinalEvent, TokenLogprob


class CompletionFormat:
    def __init__(self, request_id: str, created: int, req: CompletionRequest) -> None:
        self._id = request_id
        self._created = created
        self._model = req.model
        self._include_usage = req.include_usage
        self._speculation_stats = req.include_speculation_stats
        self._want_logprobs = req.logprobs is not None
        self._text_offsets = [0] * (req.n * len(req.prompts()))  # characters streamed so far, per choice

    def opening(self) -> list[Completion]:
        return []

    def chunk(self, event: DeltaEvent | FinalEvent) -> Completion | None:
        if isinstance(event, FinalEvent):
            choice = CompletionChoice(index=event.choice, text="", logprobs=None, finish_reason=event.finish_reason)
            return self._completion([choice])
        logprobs = self._logprobs(event.choice, event.logprobs or [])
        if not event.text and logprobs is None:
            return None
        self._text_offsets[event.choice] += len(event.text)
        choice = CompletionChoice(index=event.choice, text=event.text, logprobs=logprobs, finish_reason=None)
        return self._completion([choice])

    def usage(self, outcome: Outcomes) -> UsageInfo:
        return usage_of(outcome, self._speculation_stats)

    def usage_chunk(self, usage: UsageInfo) -> Completion:
        return self._completion([], usage)

    def body(self, outcome: Outcomes) -> Completion:
        choices = [self._choice(i, state) for i, state in enumerate(outcome.choices)]
        body = self._completion(choices)
        body.usage = self.usage(outcome)
        return body

    def _completion(self, choices: list[CompletionChoice], usage: UsageInfo | None = None) -> Completion:
        completion = Completion(
            id=self._id, object="text_completion", created=self._created, model=self._model, choices=choices
        )
        if self._include_usage:
            completion.usage = usage
        return completion

    def _logprobs(self, choice: int, entries: list[TokenLogprob]) -> CompletionLogprobs | None:
        if not self._want_logprobs or not entries:
            return None
        return legacy_logprobs(entries, self._text_offsets[choice])

    def _choice(self, index: int, state: ChoiceState) -> CompletionChoice:
        logprobs = legacy_logprobs(state.logprobs, 0) if self._want_logprobs else None
        return CompletionChoice(
            index=index, text="".join(state.text), logprobs=logprobs, finish_reason=state.finish_reason
        )


def legacy_logprobs(entries: list[TokenLogprob], start_offset: int) -> CompletionLogprobs:
    offsets = []
    for entry in entries:
        offsets.append(start_offset)
        start_offset += len(entry.token)
    return CompletionLogprobs(
        tokens=[entry.token for entry in entries],
        token_logprobs=[entry.logprob for entry in entries],
        top_logprobs=[{top.token: top.logprob for top in entry.top_logprobs} for entry in entries],
        text_offset=offsets,
    )
