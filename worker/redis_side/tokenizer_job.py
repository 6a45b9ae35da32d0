"""A "tokenize" job's reply (shared/tokenizer_api.py), from the model's own tokenizer and chat
template, in vLLM's shapes:

    tokenize       {"count", "max_model_len", "tokens", "token_strs"}
    detokenize     {"prompt"}
    info           {"tokenizer_class", "bos_token", "eos_token", "pad_token", "unk_token",
                    "chat_template", "model_max_length", "vocab_size", "add_bos_token"}

A prompt is encoded exactly as /v1/completions encodes it (`ServingModel.encode_text`, BOS where
the model wants one), or without special tokens when `add_special_tokens` is false; messages are
rendered as /v1/chat/completions renders them.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from shared.protocol import ErrorCode, Job
from shared.tokenizer_api import DetokenizeRequest, TokenizeRequest, TokenizerJob
from worker.chat.template import ChatTemplateError
from worker.redis_side.jobs import RESERVED_TEMPLATE_ARGS, JobRejected, PoisonJob, chat_messages
from worker.serving_model import ServingModel


def answer(job: Job, served: ServingModel) -> dict[str, Any]:
    """The endpoint's reply; raises PoisonJob (malformed body) or JobRejected (a request this
    model cannot answer: an id outside its vocabulary, a template that refuses the messages)."""
    try:
        request = TokenizerJob.model_validate_json(job.body)
    except ValidationError as error:
        raise PoisonJob(f"malformed tokenize job body: {error.errors()[0].get('msg', '')}", job.id) from error
    if request.op == "tokenize" and request.tokenize is not None:
        return _tokenized(request.tokenize, served)
    if request.op == "detokenize" and request.detokenize is not None:
        return _detokenized(request.detokenize, served)
    if request.op == "info":
        return tokenizer_info(served)
    raise PoisonJob(f"tokenize job {request.op!r} without its request", job.id)


def _tokenized(request: TokenizeRequest, served: ServingModel) -> dict[str, Any]:
    tokens = _prompt_ids(request, served) if request.prompt is not None else _chat_ids(request, served)
    reply: dict[str, Any] = {"count": len(tokens), "max_model_len": served.runner.max_context, "tokens": tokens}
    reply["token_strs"] = (
        [served.tokenizer.id_to_token(token) for token in tokens] if request.return_token_strs else None
    )
    return reply


def _prompt_ids(request: TokenizeRequest, served: ServingModel) -> list[int]:
    assert request.prompt is not None
    if request.add_special_tokens is False:
        return served.tokenizer.encode(request.prompt, add_special_tokens=False).ids
    return served.encode_text(request.prompt)


def _chat_ids(request: TokenizeRequest, served: ServingModel) -> list[int]:
    assert request.messages is not None
    if served.template is None:
        raise JobRejected(f"messages: model {served.name} has no chat template", ErrorCode.INVALID_REQUEST)
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools] if request.tools else None
    kwargs = {k: v for k, v in (request.chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_ARGS}
    try:
        text = served.template.render(
            chat_messages(request.messages), tools=tools, add_generation_prompt=request.add_generation_prompt, **kwargs
        )
    except (ChatTemplateError, TypeError) as error:
        raise JobRejected(f"messages: {error}", ErrorCode.INVALID_REQUEST) from error
    ids = served.tokenizer.encode(text, add_special_tokens=False).ids
    bos = served.loaded.checkpoint.bos_token_id
    if request.add_special_tokens and bos is not None and ids[:1] != [bos]:
        ids = [bos] + ids
    return ids


def _detokenized(request: DetokenizeRequest, served: ServingModel) -> dict[str, Any]:
    vocab_size = served.tokenizer.get_vocab_size(with_added_tokens=True)
    largest = max(request.tokens, default=-1)
    if largest >= vocab_size:
        raise JobRejected(
            f"tokens: token id {largest} is outside this model's vocabulary of {vocab_size} tokens",
            ErrorCode.INVALID_REQUEST,
        )
    return {"prompt": served.tokenizer.decode(request.tokens, skip_special_tokens=False)}


def tokenizer_info(served: ServingModel) -> dict[str, Any]:
    checkpoint = served.loaded.checkpoint
    special = checkpoint.special_tokens
    tokenizer = served.tokenizer
    eos = special.get("eos_token") or _token(served, checkpoint.eos_token_ids[0] if checkpoint.eos_token_ids else None)
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": special.get("bos_token") or _token(served, checkpoint.bos_token_id),
        "eos_token": eos,
        "pad_token": special.get("pad_token"),
        "unk_token": special.get("unk_token"),
        "chat_template": served.template.source if served.template is not None else None,
        "model_max_length": served.runner.max_context,
        "vocab_size": tokenizer.get_vocab_size(with_added_tokens=True),
        "add_bos_token": checkpoint.add_bos_token,
    }


def _token(served: ServingModel, token_id: int | None) -> str | None:
    return None if token_id is None else served.tokenizer.id_to_token(token_id)
