"""One turn of `arbor bench agent --recorded`, streamed through `/v1/messages` or
`/v1/chat/completions`, timed as client.py times a request, with the prompt's size and the
prefill cache's share as each API reports them:

- messages: `message_start`'s usage (`input_tokens` is what was computed, `cache_read_input_tokens`
  what the prefill cache served: the prompt is their sum), `message_delta`'s for the output count;
  content = a `content_block_delta` (text, thinking or a tool call's JSON); end = `message_stop`.
- chat: the usage chunk (`prompt_tokens`, `prompt_tokens_details.cached_tokens`,
  `completion_tokens`); content = a delta with content, reasoning or a tool call; end = `[DONE]`.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ops.bench.client import DONE, HttpError, RequestRecord, SseClient, sse_events

PATHS = {"messages": "/v1/messages", "chat": "/v1/chat/completions"}


@dataclass(slots=True)
class RecordedTurn:
    api: str
    turn: int
    record: RequestRecord = field(default_factory=RequestRecord)
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first ÷ the time after the first content: 1 / TPOT."""
        tpot_s = self.record.tpot_s
        return 1 / tpot_s if tpot_s else None

    def read(self, data: dict[str, Any], started: float) -> bool:
        """Take one event in; True at the stream's end. Raises ValueError on an error event."""
        return self._read_messages(data, started) if self.api == "messages" else self._read_chat(data, started)

    def _read_messages(self, data: dict[str, Any], started: float) -> bool:
        kind = data.get("type")
        if kind == "error":
            raise ValueError(f"stream error: {data.get('error')}")
        if kind == "message_start":
            self._messages_usage(data["message"]["usage"])
        elif kind == "content_block_delta":
            delta = data["delta"]
            if delta.get("text") or delta.get("thinking") or delta.get("partial_json"):
                self.record.text_arrived(started)
        elif kind == "message_delta":
            self._messages_usage(data["usage"])
            self.record.completion_tokens = data["usage"]["output_tokens"]
        return kind == "message_stop"

    def _messages_usage(self, usage: dict[str, Any]) -> None:
        self.cached_tokens = usage.get("cache_read_input_tokens") or 0
        self.prompt_tokens = usage["input_tokens"] + self.cached_tokens

    def _read_chat(self, data: dict[str, Any], started: float) -> bool:
        if data is DONE:
            return True
        if "error" in data:
            raise ValueError(f"stream error: {data['error']}")
        for choice in data.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                self.record.text_arrived(started)
        usage = data.get("usage")
        if usage:
            self.prompt_tokens = usage["prompt_tokens"]
            self.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            self.record.completion_tokens = usage["completion_tokens"]
        return False


async def stream_turn(client: SseClient, api: str, body: dict[str, Any], turn: int) -> RecordedTurn:
    result = RecordedTurn(api, turn)
    record, started = result.record, time.perf_counter()
    try:
        async with asyncio.timeout(client.timeout_s), client.post(PATHS[api], body) as response:
            if response.status != 200:
                record.error = f"HTTP {response.status}: {(await response.read()).decode()[:300]}"
                return result
            async for data in sse_events(response.body()):
                if result.read(data, started):
                    record.e2e_s = time.perf_counter() - started
        record.ok = record.completion_tokens > 0 and record.e2e_s > 0
        record.error = None if record.ok else "the stream ended without its usage and its end"
    except (OSError, EOFError, TimeoutError, HttpError, ValueError) as error:  # JSON errors are ValueErrors
        record.error = f"{type(error).__name__}: {error}"
    finally:
        record.e2e_s = record.e2e_s or time.perf_counter() - started
    return result
