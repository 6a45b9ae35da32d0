"""OpenAI response bodies and stream chunks, for building replies and for /openapi.json.

Dump with `dump()` / `dump_json()` (exclude_unset): a field appears only when the builder set it,
so a delta carries just its keys while `finish_reason: null` can still be sent explicitly.
`object` (and a message's `role`, `content`) have no default, so a builder cannot forget them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from shared.openai_messages import ToolCall
from shared.protocol import TokenLogprob, ToolCallDelta


class PromptTokensDetails(BaseModel):
    cached_tokens: int  # prompt tokens served from the prefill cache


class DraftSourceUsage(BaseModel):
    drafts: int
    draft_tokens: int
    accepted_tokens: int


class SpeculationUsage(BaseModel):
    """What speculative decoding did for one request (`include_speculation_stats`), summed over its choices."""

    mode: str | None  # the worker's speculation mode
    target_forwards: int  # decode forwards of the target model
    drafts: int  # forwards that verified a non-empty draft
    draft_tokens: int
    accepted_tokens: int
    tokens_per_forward: float | None  # completion tokens ÷ target forwards
    acceptance_rate: float | None  # accepted ÷ draft tokens
    sources: dict[str, DraftSourceUsage]  # the same counts per draft source (mtp, ngram, ...)


class UsageInfo(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None
    speculation: SpeculationUsage | None = None  # only when asked: include_speculation_stats


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: UsageInfo | None = None  # present (null) on every chunk when include_usage


class ChatMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: an echoed prompt's first token (nothing before it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class PromptTokenLogprob(BaseModel):
    """vLLM's `Logprob`: one entry of a prompt position's {token id: ...} map."""

    logprob: float
    rank: int
    decoded_token: str


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    # vLLM's: per prompt token, {token id: logprob} for it and the top n (None for the first token)
    prompt_logprobs: list[dict[str, PromptTokenLogprob] | None] | None = None


class Completion(BaseModel):
    """Both the non-streaming body and each stream chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str = "arbor"
    max_model_len: int | None = None
    root: str | None = None  # for an alias: the model it names


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_unset=True)


def dump_json(model: BaseModel) -> str:
    return model.model_dump_json(exclude_unset=True)
