"""Protocol events -> text_completion objects, streamed chunk by chunk or as one body.

Legacy completions have no role chunk and no reasoning; logprobs use the old parallel-list shape
(tokens, token_logprobs, top_logprobs as {token: logprob}, text_offset).

The prompt's logprobs come in a delta of their own, before the first token. With echo and logprobs
they open the legacy lists, as OpenAI's legacy API and vLLM give them (the first token's logprob
and top_logprobs null); with `prompt_logprobs` they go into vLLM's `prompt_logprobs` field, per
position {token id: {logprob, rank, decoded_token}} for the prompt token and the top n.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.accumulate import ChoiceState, Outcomes
from gateway.completion_bodies import Completion, CompletionChoice, CompletionLogprobs, PromptTokenLogprob, UsageInfo
from gateway.speculation_usage import usage_of
from shared.openai_schema import CompletionRequest
from shared.protocol import DeltaEvent, FinalEvent, PromptLogprob, TokenLogprob, TopLogprob


class CompletionFormat:
    def __init__(self, request_id: str, created: int, req: CompletionRequest) -> None:
        self._id = request_id
        self._created = created
        self._model = req.model
        self._include_usage = req.include_usage
        self._speculation_stats = req.include_speculation_stats
        self._want_logprobs = req.logprobs is not None
        self._num_top = req.logprobs or 0
        self._echo_logprobs = req.echo and req.logprobs is not None
        self._num_prompt_logprobs = req.prompt_logprobs
        self._text_offsets = [0] * (req.n * len(req.prompts()))  # characters streamed so far, per choice

    def opening(self) -> list[Completion]:
        return []

    def chunk(self, event: DeltaEvent | FinalEvent) -> Completion | None:
        if isinstance(event, FinalEvent):
            choice = CompletionChoice(index=event.choice, text="", logprobs=None, finish_reason=event.finish_reason)
            return self._completion([choice])
        entries: list[LegacyEntry | TokenLogprob] = [*self._prompt_entries(event.prompt_logprobs)]
        entries += event.logprobs or []
        logprobs = self._logprobs(event.choice, entries)
        prompt_logprobs = self._vllm_prompt_logprobs(event.prompt_logprobs)
        if not event.text and logprobs is None and prompt_logprobs is None:
            return None
        self._text_offsets[event.choice] += len(event.text)
        choice = CompletionChoice(index=event.choice, text=event.text, logprobs=logprobs, finish_reason=None)
        if prompt_logprobs is not None:
            choice.prompt_logprobs = prompt_logprobs
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

    def _logprobs(self, choice: int, entries: Sequence[LegacyEntry | TokenLogprob]) -> CompletionLogprobs | None:
        if not self._want_logprobs or not entries:
            return None
        return legacy_logprobs(entries, self._text_offsets[choice])

    def _choice(self, index: int, state: ChoiceState) -> CompletionChoice:
        entries: list[LegacyEntry | TokenLogprob] = [*self._prompt_entries(state.prompt_logprobs)]
        entries += state.logprobs
        logprobs = legacy_logprobs(entries, 0) if self._want_logprobs else None
        choice = CompletionChoice(
            index=index, text="".join(state.text), logprobs=logprobs, finish_reason=state.finish_reason
        )
        prompt_logprobs = self._vllm_prompt_logprobs(state.prompt_logprobs)
        if prompt_logprobs is not None:
            choice.prompt_logprobs = prompt_logprobs
        return choice

    def _prompt_entries(self, prompt: list[PromptLogprob] | None) -> list[LegacyEntry]:
        """The prompt's tokens for the legacy lists (echo with logprobs), top n as asked."""
        if prompt is None or not self._echo_logprobs:
            return []
        return [_legacy_prompt_entry(entry, self._num_top) for entry in prompt]

    def _vllm_prompt_logprobs(
        self, prompt: list[PromptLogprob] | None
    ) -> list[dict[str, PromptTokenLogprob] | None] | None:
        if prompt is None or self._num_prompt_logprobs is None:
            return None
        return [_vllm_position(entry, self._num_prompt_logprobs) for entry in prompt]


@dataclass(slots=True)
class LegacyEntry:
    """One token of the legacy lists; an echoed prompt's first token has no logprob."""

    token: str
    logprob: float | None
    top_logprobs: list[TopLogprob] | None


def _legacy_prompt_entry(entry: PromptLogprob, num_top: int) -> LegacyEntry:
    if entry.logprob is None:  # the first token
        return LegacyEntry(entry.token, None, None)
    return LegacyEntry(entry.token, entry.logprob, entry.top[:num_top])


def _vllm_position(entry: PromptLogprob, num_top: int) -> dict[str, PromptTokenLogprob] | None:
    """{token id: ...} for the prompt token and the top n, as vLLM's prompt_logprobs (None first)."""
    if entry.logprob is None or entry.rank is None:
        return None
    position = {
        str(entry.token_id): PromptTokenLogprob(logprob=entry.logprob, rank=entry.rank, decoded_token=entry.token)
    }
    for rank, (token_id, top) in enumerate(zip(entry.top_ids[:num_top], entry.top[:num_top], strict=True), start=1):
        position.setdefault(str(token_id), PromptTokenLogprob(logprob=top.logprob, rank=rank, decoded_token=top.token))
    return position


def legacy_logprobs(entries: Sequence[LegacyEntry | TokenLogprob], start_offset: int) -> CompletionLogprobs:
    offsets = []
    for entry in entries:
        offsets.append(start_offset)
        start_offset += len(entry.token)
    return CompletionLogprobs(
        tokens=[entry.token for entry in entries],
        token_logprobs=[entry.logprob for entry in entries],
        top_logprobs=[
            None if entry.top_logprobs is None else {top.token: top.logprob for top in entry.top_logprobs}
            for entry in entries
        ],
        text_offset=offsets,
    )
