"""One conversation of `arbor bench agent`, replayed turn by turn through the gateway's chat route.

Each turn is one streamed request, timed as `client.py` times a request (TTFT: request sent ->
first chunk with content or a tool call; inter-token latency: gaps between such chunks), and read
whole: the text, the tool calls (reassembled from their deltas as a client does), the usage with
`prompt_tokens_details.cached_tokens` and `speculation` (asked with `include_speculation_stats`).
The answer goes back into the history, the bench's tool results after it (agent_workloads.py).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ops.bench.agent_workloads import Conversation, Turn
from ops.bench.client import DONE, HttpError, RequestRecord, SseClient, sse_events


@dataclass(slots=True)
class TurnResult:
    workload: str
    turn: int
    forced_call: bool  # tool_choice named a function
    constrained: bool  # response_format json_schema
    record: RequestRecord = field(default_factory=RequestRecord)
    content: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)  # index -> id, name, arguments
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    speculation: dict[str, Any] | None = None  # usage.speculation

    @property
    def text(self) -> str:
        return "".join(self.content)

    def tool_calls(self) -> list[dict[str, str]]:
        return [self.calls[index] for index in sorted(self.calls)]

    def add_chunk(self, chunk: dict[str, Any], started: float) -> None:
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content"):
                self.record.text_arrived(started)
            self.content.append(delta.get("content") or "")
            for call in delta.get("tool_calls") or []:
                self._merge_call(call)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        usage = chunk.get("usage")
        if usage:
            self.record.completion_tokens = usage["completion_tokens"]
            self.prompt_tokens = usage["prompt_tokens"]
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            self.speculation = usage.get("speculation")

    def _merge_call(self, delta: dict[str, Any]) -> None:
        call = self.calls.setdefault(delta["index"], {"id": "", "name": "", "arguments": ""})
        function = delta.get("function") or {}
        call["id"] = delta.get("id") or call["id"]
        call["name"] = function.get("name") or call["name"]
        call["arguments"] += function.get("arguments") or ""


def turn_body(model: str, conversation: Conversation, turn: Turn, messages: list[dict], temperature: float) -> dict:
    body: dict[str, Any] = {
        "model": model,
        "messages": list(messages),
        "max_tokens": turn.max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "include_speculation_stats": True,
    }
    if conversation.tools:
        body["tools"] = conversation.tools
        body["parallel_tool_calls"] = False  # a forced turn: exactly one call
    if turn.tool_choice is not None:
        body["tool_choice"] = turn.tool_choice
    if turn.response_format is not None:
        body["response_format"] = turn.response_format
    return body


async def stream_turn(client: SseClient, body: dict, result: TurnResult) -> TurnResult:
    record, started = result.record, time.perf_counter()
    try:
        async with asyncio.timeout(client.timeout_s), client.post("/v1/chat/completions", body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.read()).decode()[:300]}"
                return result
            async for data in sse_events(response.body()):
                if data is DONE:
                    record.e2e_s = time.perf_counter() - started
                elif "error" in data:
                    record.error = f"stream error: {data['error']}"
                    return result
                else:
                    result.add_chunk(data, started)
        record.ok = record.completion_tokens > 0 and record.e2e_s > 0
        record.error = None if record.ok else "the stream ended without its usage and its end"
    except (OSError, EOFError, TimeoutError, HttpError, ValueError) as error:
        record.error = f"{type(error).__name__}: {error}"
    finally:
        record.e2e_s = record.e2e_s or time.perf_counter() - started
    return result


async def replay(client: SseClient, model: str, conversation: Conversation, temperature: float) -> list[TurnResult]:
    """Every turn of the conversation in order; a failed turn ends it (its history would be wrong)."""
    conversation = conversation.fresh()
    messages = conversation.first_messages()
    results: list[TurnResult] = []
    for index, turn in enumerate(conversation.turns):
        if turn.user is not None:
            messages.append({"role": "user", "content": turn.user})
        forced = isinstance(turn.tool_choice, dict)
        result = TurnResult(conversation.workload, index, forced, turn.response_format is not None)
        results.append(await stream_turn(client, turn_body(model, conversation, turn, messages, temperature), result))
        if not result.record.ok:
            break
        messages += history_after(conversation, result)
    return results


def history_after(conversation: Conversation, result: TurnResult) -> list[dict[str, Any]]:
    """The model's answer as the next request's history, then one tool message per call."""
    calls = result.tool_calls()
    # content "" rather than null beside calls: plain ChatML templates concatenate it
    assistant: dict[str, Any] = {"role": "assistant", "content": result.text}
    if calls:
        assistant["tool_calls"] = [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}
            for call in calls
        ]
    tool_messages = [
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": conversation.tool_result(call["name"], call["arguments"]),
        }
        for call in calls
    ]
    return [assistant, *tool_messages]
