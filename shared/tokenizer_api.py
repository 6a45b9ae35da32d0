"""The bodies of vLLM's tokenizer endpoints (POST /tokenize, POST /detokenize, GET /tokenizer_info),
and the job that carries them to a worker of the model.

The gateway loads no tokenizer, so each is a job of kind "tokenize" on the model's stream, as
`/v1/messages/count_tokens` is a "count" job: the worker answers from its own tokenizer and chat
template (the very ones its requests are encoded with) in one `FinalEvent` whose `result` holds
the endpoint's reply, without the owner thread. The job's body is a `TokenizerJob`.

lm-eval's remote tokenizer (`tokenizer_backend=remote`) reads exactly these: `/tokenizer_info`'s
eos/bos/pad tokens and chat template, `/tokenize` with `{"prompt", "add_special_tokens": false}`
-> `tokens`, `/detokenize` with `{"tokens"}` -> `prompt`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from shared.openai_messages import Message, Tool
from shared.openai_schema import UnsupportedField
from shared.request_fields import Lenient

MAX_DETOKENIZE_TOKENS = 1 << 20  # a body cap bounds it first; this keeps a worker's reply bounded too


class TokenizeRequest(Lenient):
    """vLLM's TokenizeCompletionRequest or TokenizeChatRequest: `prompt` or `messages`, not both."""

    model: str | None = Field(None, min_length=1)  # optional, as vLLM's: the one model served
    prompt: str | None = None
    messages: list[Message] | None = Field(None, min_length=1)
    # default: True for a prompt (BOS where the model wants it), False for messages (the template writes it)
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise UnsupportedField("prompt", "give either prompt or messages")
        if self.continue_final_message:
            raise UnsupportedField("continue_final_message", "is not supported")
        return self


class DetokenizeRequest(Lenient):
    model: str | None = Field(None, min_length=1)
    tokens: list[int] = Field(max_length=MAX_DETOKENIZE_TOKENS)

    @model_validator(mode="after")
    def _token_ids(self) -> DetokenizeRequest:
        if any(token < 0 for token in self.tokens):
            raise UnsupportedField("tokens", "token ids are non-negative integers")
        return self


class TokenizerJob(BaseModel):
    """What a "tokenize" job asks its worker."""

    model_config = ConfigDict(extra="forbid")

    op: Literal["tokenize", "detokenize", "info"]
    tokenize: TokenizeRequest | None = None
    detokenize: DetokenizeRequest | None = None
