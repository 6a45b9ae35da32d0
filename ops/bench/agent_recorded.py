"""`arbor bench agent --recorded`: a real agent's conversation, recorded, as the turns to replay on
`/v1/messages` and the same turns translated to `/v1/chat/completions`. Torch-free.

A recording is a folder of `NN-messages.json` records (method, path, headers, body), one per
request the agent sent, in order, each carrying the whole history so far
(tests/fixtures/agent_traffic/, written by `make agent-fixtures`). Turn k replays record k's
messages as recorded: the assistant turns in the history are the recording's, not what the
served model writes now, so both APIs (and every mode and repeat) send the same prompts, and turn
k+1's prompt starts with turn k's (the prefill cache's case).

Each turn's body is the recorded one with four settings of the bench's: the served model's name,
`max_tokens` (the agent asks for 32000: a benchmark-sized cap instead), the temperature (greedy by
default; the agent sends none) and `ignore_eos`, so every turn decodes exactly `max_tokens`
tokens on both APIs. Everything else (thinking, metadata, output_config, cache_control, ...) goes
as recorded; the gateway ignores what it has no use for.

The chat translation is the bench's own, written as a client moving to chat completions would
write it, so the prompt tokens each API reports per turn are a check on the gateway's:

    system (text or blocks), then      -> one system message, first, texts joined by blank lines
      `system` entries among messages     (Claude Code sends one; chat templates take one, first)
    user: text blocks                  -> a user message, the texts joined by newlines (as the
                                          messages route joins them, and the worker OpenAI text
                                          parts, as vLLM does)
    user: tool_result blocks           -> tool messages, before the user's text
    assistant: text / thinking /       -> one assistant message: content, reasoning_content,
      tool_use blocks                     tool_calls
    tools (name, description,          -> function tools (name, description, parameters)
      input_schema)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.openai_messages import TEXT_PART_SEPARATOR

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORDINGS_ROOT = REPO_ROOT / "tests" / "fixtures" / "agent_traffic"
# name -> the recording's folder under RECORDINGS_ROOT
RECORDINGS = {"claude-code": "claude-code-2.1.332"}
APIS = ("messages", "chat")  # the order of a repeat's first replay; the next repeat reverses it


@dataclass(slots=True, frozen=True)
class TurnSettings:
    model: str  # the served model's name
    max_tokens: int
    temperature: float


@dataclass(slots=True, frozen=True)
class RecordedConversation:
    name: str
    source: str  # the recording's folder, relative to the repository where it is inside it
    bodies: list[dict[str, Any]]  # each turn's recorded /v1/messages body, in order

    def messages_body(self, turn: int, settings: TurnSettings) -> dict[str, Any]:
        return self.bodies[turn] | _bench_fields(settings)

    def chat_body(self, turn: int, settings: TurnSettings) -> dict[str, Any]:
        body = chat_conversation(self.bodies[turn]) | _bench_fields(settings)
        return body | {"stream_options": {"include_usage": True}}


def load_recording(name_or_folder: str) -> RecordedConversation:
    """A recording by name (RECORDINGS) or a folder of `NN-messages.json` records; ValueError
    naming the flag's value when there is none."""
    folder = RECORDINGS_ROOT / RECORDINGS[name_or_folder] if name_or_folder in RECORDINGS else Path(name_or_folder)
    paths = sorted(folder.glob("*-messages.json")) if folder.is_dir() else []
    if not paths:
        names = ", ".join(RECORDINGS)
        raise ValueError(f"--recorded={name_or_folder!r}: no NN-messages.json records there; name one of {names}")
    records = [json.loads(path.read_text()) for path in paths]
    bodies = [record["body"] for record in records if record["method"] == "POST" and record["body"].get("stream")]
    if len(bodies) < len(records):
        raise ValueError(f"--recorded={name_or_folder!r}: every record must be a streamed POST /v1/messages")
    try:
        source = str(folder.resolve().relative_to(REPO_ROOT))
    except ValueError:
        source = str(folder)
    return RecordedConversation(name_or_folder, source, bodies)


def _bench_fields(settings: TurnSettings) -> dict[str, Any]:
    return {
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "ignore_eos": True,  # an Arbor extension on both routes: every turn decodes max_tokens
        "stream": True,
    }


def chat_conversation(body: dict[str, Any]) -> dict[str, Any]:
    """A messages body's conversation as chat completions' messages and tools (module docstring)."""
    entries = [message for message in body["messages"] if message["role"] == "system"]
    texts = [_system_text(body["system"])] if body.get("system") else []
    texts += [_system_text(entry["content"]) for entry in entries]
    system = "\n\n".join(text for text in texts if text)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in body["messages"]:
        if message["role"] == "user":
            messages += _user(message["content"])
        elif message["role"] == "assistant":
            messages.append(_assistant(message["content"]))
    chat: dict[str, Any] = {"messages": messages}
    tools = [_function_tool(tool) for tool in body.get("tools") or [] if tool.get("type") in (None, "custom")]
    if tools:
        chat["tools"] = tools
    return chat


def _blocks(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    known = {"text", "thinking", "redacted_thinking", "tool_use", "tool_result"}
    unknown = [block["type"] for block in blocks if block["type"] not in known]
    if unknown:
        raise ValueError(f"a recorded content block of type {unknown[0]!r} has no chat translation here")
    return blocks


def _system_text(content: str | list[dict[str, Any]]) -> str:
    return "\n\n".join(block["text"] for block in _blocks(content) if block["type"] == "text")


def _user(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks = _blocks(content)
    results = [_tool_message(block) for block in blocks if block["type"] == "tool_result"]
    texts = [block["text"] for block in blocks if block["type"] == "text"]
    return results + ([{"role": "user", "content": TEXT_PART_SEPARATOR.join(texts)}] if texts or not results else [])


def _tool_message(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content") or ""
    text = content if isinstance(content, str) else TEXT_PART_SEPARATOR.join(part.get("text", "") for part in content)
    return {
        "role": "tool",
        "tool_call_id": block["tool_use_id"],
        "content": ("Error: " if block.get("is_error") else "") + text,
    }


def _assistant(content: str | list[dict[str, Any]]) -> dict[str, Any]:
    blocks = _blocks(content)
    calls = [
        {
            "id": block["id"],
            "type": "function",
            "function": {"name": block["name"], "arguments": json.dumps(block["input"], ensure_ascii=False)},
        }
        for block in blocks
        if block["type"] == "tool_use"
    ]
    text = TEXT_PART_SEPARATOR.join(block["text"] for block in blocks if block["type"] == "text")
    message: dict[str, Any] = {"role": "assistant", "content": text if text or not calls else None}
    reasoning = "".join(block["thinking"] for block in blocks if block["type"] == "thinking")
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}
