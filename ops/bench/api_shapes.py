"""The three APIs a benchmark client can speak to a server: the request body and the reading of
its stream. Torch-free.

- chat: `POST /v1/chat/completions`, chunks with `choices[].delta`, usage from
  `stream_options.include_usage`, then `data: [DONE]`;
- messages (Anthropic): `POST /v1/messages`, `content_block_delta` events, usage in
  `message_delta`, ending with `message_stop`;
- responses (OpenAI): `POST /v1/responses`, `response.output_text.delta` events, usage in
  `response.completed` (or `.incomplete`).
`ignore_eos` is an extension Arbor takes on all three (and vLLM and llama-server on chat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

APIS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


@dataclass(slots=True)
class StreamEvent:
    """What one streamed event says, whatever the API."""

    has_text: bool = False
    completion_tokens: int | None = None
    done: bool = False
    error: str | None = None


def request_body(api: str, model: str, prompt: str, max_tokens: int, temperature: float, ignore_eos: bool) -> dict:
    extra: dict[str, Any] = {"ignore_eos": True} if ignore_eos else {}
    if api == "messages":
        turn = [{"role": "user", "content": prompt}]
        return {"model": model, "messages": turn, "max_tokens": max_tokens, "temperature": temperature,
                "stream": True, **extra}  # fmt: skip
    if api == "responses":
        return {"model": model, "input": prompt, "max_output_tokens": max_tokens, "temperature": temperature,
                "stream": True, "store": False, **extra}  # fmt: skip
    assert api == "chat", api
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def read_event(api: str, data: dict | None) -> StreamEvent:
    """`data` is one event's JSON, or None for chat's `data: [DONE]`."""
    if data is None:
        return StreamEvent(done=True)
    if api == "messages":
        return _messages_event(data)
    if api == "responses":
        return _responses_event(data)
    if "error" in data:
        return StreamEvent(error=str(data["error"].get("message", data["error"])))
    usage = data.get("usage") or {}
    has_text = any(
        choice.get("delta", {}).get("content") or choice.get("delta", {}).get("reasoning_content")
        for choice in data.get("choices") or []
    )
    return StreamEvent(has_text=bool(has_text), completion_tokens=usage.get("completion_tokens"))


def _messages_event(data: dict) -> StreamEvent:
    kind = data.get("type")
    if kind == "error":
        return StreamEvent(error=str(data.get("error", {}).get("message", data)))
    if kind == "content_block_delta":
        delta = data.get("delta", {})
        return StreamEvent(has_text=bool(delta.get("text") or delta.get("thinking")))
    if kind == "message_delta":
        return StreamEvent(completion_tokens=data.get("usage", {}).get("output_tokens"))
    return StreamEvent(done=kind == "message_stop")


def _responses_event(data: dict) -> StreamEvent:
    kind = data.get("type", "")
    if kind in ("error", "response.failed"):
        return StreamEvent(error=str(data.get("message") or data.get("response", {}).get("error") or data))
    if kind in ("response.output_text.delta", "response.reasoning_text.delta"):
        return StreamEvent(has_text=bool(data.get("delta")))
    if kind in ("response.completed", "response.incomplete"):
        usage = data.get("response", {}).get("usage") or {}
        return StreamEvent(completion_tokens=usage.get("output_tokens"), done=True)
    return StreamEvent()
