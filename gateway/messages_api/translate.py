"""A messages request -> the chat request the chat route would enqueue: the same job, the same path.

    system (text or blocks), then   -> one system message, first (texts joined by blank lines:
      `system` entries in messages     chat templates take one system message, at the start)
    user: text blocks               -> a user message
    user: tool_result blocks        -> tool messages (first: they answer the assistant turn before),
                                       then the user's text, if any
    assistant: thinking / text /    -> one assistant message: reasoning_content, content, tool_calls
      tool_use blocks                  (redacted_thinking has nothing readable: dropped)
    tools / tool_choice             -> function tools; auto / any -> required / tool -> named / none
    thinking enabled, budget_tokens -> reasoning_budget, enable_thinking; disabled -> budget 0, off;
                                       adaptive -> the model's default
    output_config.format            -> response_format json_schema
    stop_sequences, temperature, top_p, top_k, max_tokens -> the same sampling fields

`max_tokens` above the gateway's cap is lowered to it rather than refused, and the worker lowers it
further to the room the prompt leaves in the context, as on every route: Claude Code asks for
32000 whatever the model, and a shorter limit only means the answer may end sooner.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.messages_api.request import (
    ContentBlock,
    CountTokensRequest,
    InputMessage,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolChoice,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from shared.openai_messages import TEXT_PART_SEPARATOR
from shared.openai_schema import ChatCompletionRequest, Limits, limits_context

TOOL_ERROR_PREFIX = "Error: "  # a tool_result with is_error: the chat format has no such flag


def to_chat_request(req: MessagesRequest, limits: Limits) -> ChatCompletionRequest:
    """Validated again as a chat request, with the deployment's limits, so nothing the chat route
    refuses gets in this way (raises pydantic.ValidationError)."""
    body = _conversation(req) | {
        "max_tokens": req.max_tokens,
        "stream": req.stream,
        # The matched stop sequence is reported in the final event; the text stops before it.
        "stop": req.stop_sequences or None,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "seed": req.seed,
        "ignore_eos": req.ignore_eos or None,
        "priority": req.priority,
    }
    return ChatCompletionRequest.model_validate(_without_none(body), context=limits_context(limits))


def count_request(req: CountTokensRequest, limits: Limits) -> ChatCompletionRequest:
    """The chat request whose prompt is the one `to_chat_request` makes of the same fields: its
    rendering is what gets counted."""
    return ChatCompletionRequest.model_validate(
        _without_none(_conversation(req) | {"max_tokens": 1}), context=limits_context(limits)
    )


def _conversation(req: MessagesRequest | CountTokensRequest) -> dict[str, Any]:
    """What makes the prompt: messages, tools, tool_choice, thinking, the output's format."""
    turns = [message for message in req.messages if message.role != "system"]
    messages = _system(req.system, [m for m in req.messages if m.role == "system"])
    messages += [chat for message in turns for chat in _messages(message)]
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    output_format = req.output_config.format if req.output_config is not None else None
    if output_format is not None:
        json_schema = {"name": "output", "schema": output_format.schema_}
        body["response_format"] = {"type": "json_schema", "json_schema": json_schema}
    tools = [_tool(tool) for tool in req.tools or [] if tool.is_client_tool]
    if tools:
        body["tools"] = tools
        if req.tool_choice is not None:
            body |= _tool_choice(req.tool_choice)
    if req.thinking is not None and req.thinking.type == "enabled":
        body["chat_template_kwargs"] = {"enable_thinking": True}
        body["reasoning_budget"] = req.thinking.budget_tokens
    elif req.thinking is not None and req.thinking.type == "disabled":
        body["chat_template_kwargs"] = {"enable_thinking": False}
        body["reasoning_budget"] = 0
    return body


def _system(system: str | list[TextBlock] | None, entries: list[InputMessage]) -> list[dict[str, Any]]:
    texts = [] if system is None else [_text(system)]
    texts += [_text(entry.content) for entry in entries]
    text = "\n\n".join(text for text in texts if text)
    return [{"role": "system", "content": text}] if text else []


def _text(content: str | list[ContentBlock] | list[TextBlock]) -> str:
    """A system text: its text blocks joined by blank lines (other blocks have no place there)."""
    if isinstance(content, str):
        return content
    return "\n\n".join(block.text for block in content if isinstance(block, TextBlock))


def _messages(message: InputMessage) -> list[dict[str, Any]]:
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    if message.role == "assistant":
        return [_assistant(message.content)]
    return _user(message.content)


def _user(blocks: list[ContentBlock]) -> list[dict[str, Any]]:
    results = [_tool_result(block) for block in blocks if isinstance(block, ToolResultBlock)]
    text = TEXT_PART_SEPARATOR.join(block.text for block in blocks if isinstance(block, TextBlock))
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _tool_result(block: ToolResultBlock) -> dict[str, Any]:
    parts = block.content
    content = parts if isinstance(parts, str) else TEXT_PART_SEPARATOR.join(part.text for part in parts)
    if block.is_error:
        content = TOOL_ERROR_PREFIX + content
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": content}


def _assistant(blocks: list[ContentBlock]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant"}
    text = TEXT_PART_SEPARATOR.join(block.text for block in blocks if isinstance(block, TextBlock))
    reasoning = "".join(block.thinking for block in blocks if isinstance(block, ThinkingBlock))
    calls = [_tool_call(block) for block in blocks if isinstance(block, ToolUseBlock)]
    message["content"] = text if text or not calls else None
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_call(block: ToolUseBlock) -> dict[str, Any]:
    arguments = json.dumps(block.input, ensure_ascii=False)
    return {"id": block.id, "type": "function", "function": {"name": block.name, "arguments": arguments}}


def _tool(tool: ToolDefinition) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema or {"type": "object"}}
    if tool.description is not None:
        function["description"] = tool.description
    return {"type": "function", "function": function}


def _tool_choice(choice: ToolChoice) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if choice.type == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name or ""}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False
    return body


def _without_none(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if value is not None}
