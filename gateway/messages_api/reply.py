"""A finished chat job -> Anthropic's `message` body, and the pieces the stream shares with it.

    {"id": "msg_...", "type": "message", "role": "assistant", "model": ...,
     "content": [thinking?, text?, tool_use...], "stop_reason": ..., "stop_sequence": ...,
     "usage": {"input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}}

Thinking blocks carry an empty `signature`: it is Anthropic's seal on its own model's thinking,
and a client sends it back untouched (Arbor ignores it on the way in).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.accumulate import ChoiceState
from shared.openai_messages import ToolCall

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "cancelled": "end_turn"}


def message_id(request_id: str) -> str:
    """Anthropic's ids start with msg_; the rest is the job's, so logs can be matched."""
    return "msg_" + request_id.partition("-")[2]


def stop_reason(finish_reason: str | None, stop_sequence: str | None) -> str | None:
    if finish_reason is None:
        return None
    return "stop_sequence" if stop_sequence is not None else STOP_REASONS[finish_reason]


def usage(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, int]:
    """Anthropic counts cache reads apart from `input_tokens` (which is only what was computed);
    nothing is ever written to a cache on request here, so creation is 0."""
    return {
        "input_tokens": input_tokens - cached_tokens,
        "output_tokens": output_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def message(request_id: str, model: str, state: ChoiceState) -> dict[str, Any]:
    return {
        "id": message_id(request_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(state),
        "stop_reason": stop_reason(state.finish_reason, state.stop_sequence),
        "stop_sequence": state.stop_sequence,
        "usage": usage(state.prompt_tokens, state.completion_tokens, state.cached_tokens),
    }


def content_blocks(state: ChoiceState) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    reasoning, text = "".join(state.reasoning), "".join(state.text)
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if text:
        blocks.append({"type": "text", "text": text})
    blocks += [tool_use_block(call) for call in state.tool_calls()]
    return blocks


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.function.name, "input": tool_input(call.function.arguments)}


def tool_input(arguments: str) -> dict[str, Any]:
    """The call's arguments as the object Anthropic's `input` is; arguments that are not a JSON
    object (the worker only reports well-formed calls, so: never) become {}."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
