"""A chat job's events -> Anthropic's streamed message, block by block.

    event: message_start        {"message": {..., "content": [], "usage": {...}}}
    event: ping
    event: content_block_start  {"index": 0, "content_block": {"type": "thinking", ...}}
    event: content_block_delta  {"index": 0, "delta": {"type": "thinking_delta", "thinking": ...}}
    event: content_block_delta  {"index": 0, "delta": {"type": "signature_delta", "signature": ""}}
    event: content_block_stop   {"index": 0}
    event: content_block_start  {"index": 1, "content_block": {"type": "text", "text": ""}}
    event: content_block_delta  {"index": 1, "delta": {"type": "text_delta", "text": ...}}
    ...                         tool_use blocks: {"id", "name", "input": {}}, then input_json_delta
    event: message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": {...}}
    event: message_stop

A delta event may carry reasoning, text and tool-call fragments at once (a step's tokens); they go
out in that order, each opening its block when the one before was of another kind. message_start
waits for the job's first event, as Anthropic's does for the prompt's count: it carries the
prompt's size (the first delta's `prompt_tokens`, which the worker sets); how much of it the
prefill cache served is known at the end, so message_delta carries the final counts (the
anthropic SDK takes input and cache counts from message_delta when present).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.messages_api import reply
from shared.protocol import DeltaEvent, FinalEvent, ToolCallDelta

Event = tuple[str, dict[str, Any]]  # (event name, data)


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


class MessageStream:
    def __init__(self, request_id: str, model: str) -> None:
        self._id = reply.message_id(request_id)
        self._model = model
        self._index = -1  # the open block's index
        self._open: str | None = None  # its kind: "thinking", "text", or "tool_use:<call index>"
        self._started = False

    def events(self, event: DeltaEvent | FinalEvent) -> list[Event]:
        """The events `event` makes, message_start and ping first if it is the job's first."""
        if self._started:
            return self._events(event)
        self._started = True
        prompt_tokens = event.prompt_tokens if isinstance(event, DeltaEvent) else event.usage.prompt_tokens
        return self.opening(prompt_tokens or 0) + self._events(event)

    def opening(self, prompt_tokens: int) -> list[Event]:
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": reply.usage(prompt_tokens, 0, 0),
        }
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _events(self, event: DeltaEvent | FinalEvent) -> list[Event]:
        if isinstance(event, FinalEvent):
            return self._closing(event)
        out: list[Event] = []
        if event.reasoning:
            out += self._into("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": event.reasoning}))
        if event.text:
            out += self._into("text", {"type": "text", "text": ""})
            out.append(self._delta({"type": "text_delta", "text": event.text}))
        for call in event.tool_calls:
            out += self._tool_call(call)
        return out

    def _tool_call(self, call: ToolCallDelta) -> list[Event]:
        name = call.function.name if call.function is not None else None
        start = {"type": "tool_use", "id": call.id or "", "name": name or "", "input": {}}
        out = self._into(f"tool_use:{call.index}", start)
        arguments = call.function.arguments if call.function is not None else None
        if arguments:
            out.append(self._delta({"type": "input_json_delta", "partial_json": arguments}))
        return out

    def _into(self, kind: str, block: dict[str, Any]) -> list[Event]:
        """Open a block of `kind` unless it is the open one, closing the one before."""
        if self._open == kind:
            return []
        out = self._close()
        self._index += 1
        self._open = kind
        out.append(
            ("content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block})
        )
        return out

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        out: list[Event] = []
        if self._open == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": ""}))
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self._index}))
        self._open = None
        return out

    def _delta(self, delta: dict[str, Any]) -> Event:
        return ("content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _closing(self, final: FinalEvent) -> list[Event]:
        usage = final.usage
        delta = {
            "stop_reason": reply.stop_reason(final.finish_reason, final.stop_sequence),
            "stop_sequence": final.stop_sequence,
        }
        message_delta = {
            "type": "message_delta",
            "delta": delta,
            "usage": reply.usage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens),
        }
        return [*self._close(), ("message_delta", message_delta), ("message_stop", {"type": "message_stop"})]
