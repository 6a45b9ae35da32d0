"""What a well-formed stream of each API looks like, checked event by event, for replayed agent
traffic: chat completions (chunks, then one `data: [DONE]`), Anthropic's Messages (message_start,
content blocks as start/delta/stop of one index, message_delta, message_stop) and the Responses
API (response.created first, one terminal event last). Each check returns the tool calls' argument
strings, so the caller can require that every one parses as JSON.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class SseEvent:
    name: str | None  # the `event:` line; None for chat completions' unnamed chunks
    data: str


def parse_sse(text: str) -> list[SseEvent]:
    events: list[SseEvent] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next((line[len("event:") :].strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line[len("data:") :].lstrip() for line in lines if line.startswith("data:"))
        events.append(SseEvent(name, data))
    return events


def check_chat_stream(events: list[SseEvent]) -> list[str]:
    assert events and events[-1].data == "[DONE]", f"the stream does not end with [DONE]: {events[-3:]}"
    chunks = [json.loads(event.data) for event in events[:-1]]  # one [DONE], the last event
    arguments: dict[tuple[int, int], str] = {}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk", chunk
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            for call in choice["delta"].get("tool_calls") or []:
                key = (choice["index"], call["index"])
                arguments[key] = arguments.get(key, "") + (call.get("function", {}).get("arguments") or "")
    assert any(choice.get("finish_reason") for chunk in chunks for choice in chunk["choices"]), "no finish_reason"
    return list(arguments.values())


def check_messages_stream(events: list[SseEvent]) -> list[str]:
    names = [event.name for event in events if event.name != "ping"]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
    open_block: int | None = None
    arguments: list[str] = []
    for event in events[1:-2]:
        payload: dict[str, Any] = json.loads(event.data)
        if event.name == "content_block_start":
            assert open_block is None, f"block {payload['index']} starts inside block {open_block}"
            open_block = payload["index"]
            if payload["content_block"]["type"] == "tool_use":
                arguments.append("")
        elif event.name in ("content_block_delta", "content_block_stop"):
            assert payload["index"] == open_block, f"{event.name} of block {payload['index']}, open: {open_block}"
            if payload.get("delta", {}).get("type") == "input_json_delta":
                arguments[-1] += payload["delta"]["partial_json"]
            open_block = None if event.name == "content_block_stop" else open_block
        else:
            assert event.name == "ping", f"unexpected event {event.name} between blocks"
    assert open_block is None, f"block {open_block} never stops"
    return [text or "{}" for text in arguments]


def check_responses_stream(events: list[SseEvent]) -> list[str]:
    names = [event.name for event in events]
    assert names[0] == "response.created", names
    assert names[-1] in ("response.completed", "response.incomplete"), names[-3:]
    assert "response.failed" not in names and "error" not in names, names
    payloads = [json.loads(event.data) for event in events]
    assert all(payload["type"] == event.name for payload, event in zip(payloads, events)), "type differs from event"
    done_items = [payload["item"] for payload in payloads if payload["type"] == "response.output_item.done"]
    return [item["arguments"] for item in done_items if item["type"] == "function_call"]


STREAM_CHECKS = {
    "/v1/chat/completions": check_chat_stream,
    "/v1/messages": check_messages_stream,
    "/v1/responses": check_responses_stream,
}
