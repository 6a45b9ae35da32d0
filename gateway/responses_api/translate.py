"""A Responses request -> the `ChatCompletionRequest` the chat route enqueues, and what was skipped.

The worker never sees the Responses API: it gets an ordinary chat job. Items become messages:

    instructions                        -> a system message, first
    message (user/system/developer)     -> that message, text parts joined
    reasoning                           -> reasoning_content of the next assistant turn
    message (assistant), function_call  -> one assistant message: its text, its tool_calls
                                           (consecutive ones merge, as chat writes one turn)
    function_call_output                -> a tool message answering call_id
    hosted tools' calls                 -> skipped, with a warning

`previous_response_id` puts the stored response's input and output items in front of the new
input; its instructions are not carried over (OpenAI's rule: send them again).

`reasoning.effort` becomes the reasoning budget (tokens between the think tags before the close
tag is forced), chat's mapping: none 0, minimal 256, low 1024, medium 4096, high 16384, and
xhigh 32768; `none` also renders the template with `enable_thinking: false`, so templates that
know the switch leave the think block out altogether.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from gateway import errors
from gateway.errors import ApiError
from gateway.responses_api.objects import ResponseWarning
from gateway.responses_api.request import (
    Effort,
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    HostedChoice,
    HostedTool,
    InputItem,
    MessageItem,
    ReasoningItem,
    ResponsesRequest,
    SkippedItem,
)
from shared.openai_schema import REASONING_EFFORT_BUDGETS, ChatCompletionRequest, Limits, limits_context

EFFORT_BUDGETS: dict[str, int] = {**REASONING_EFFORT_BUDGETS, "xhigh": 32768}

# Chat field names a chat validation error may name -> the Responses field the user sent; the
# first matching prefix wins.
_RENAMED = (
    ("response_format.json_schema.", "text.format."),
    ("response_format", "text.format"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
    ("reasoning_budget", "reasoning.effort"),
)

_ITEMS = TypeAdapter(list[InputItem])


@dataclass(slots=True)
class Translation:
    chat: ChatCompletionRequest
    items: list[dict[str, Any]]  # the conversation so far as input items: previous + this input
    warnings: list[ResponseWarning] = field(default_factory=list)


def translate(req: ResponsesRequest, previous_items: list[dict[str, Any]], limits: Limits) -> Translation:
    """Raises ApiError (400) naming the Responses field when the chat request would not validate."""
    own_items = req.items()
    items = _ITEMS.validate_python(previous_items) + own_items
    warnings = _skipped_items(own_items) + _skipped_tools(req)
    tool_choice = _tool_choice(req, warnings)
    messages = _messages(req.instructions, items)
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "ignore_eos": req.ignore_eos or None,
        "priority": req.priority,
        "user": req.user,
        "parallel_tool_calls": req.parallel_tool_calls,
        "tool_choice": tool_choice,
        "tools": [_chat_tool(tool) for tool in req.function_tools()] or None,
        "response_format": _response_format(req),
        **_reasoning(req.effort()),
    }
    chat = _validated({name: value for name, value in body.items() if value is not None}, limits)
    conversation = [_dump(item) for item in items]
    return Translation(chat, conversation, warnings)


def _validated(body: dict[str, Any], limits: Limits) -> ChatCompletionRequest:
    try:
        return ChatCompletionRequest.model_validate(body, context=limits_context(limits))
    except ValidationError as exc:
        raise _renamed(errors.from_validation(exc)) from None


def _renamed(error: ApiError) -> ApiError:
    for chat_name, name in _RENAMED:
        if error.param is not None and error.param.startswith(chat_name):
            error.message = error.message.replace(chat_name, name)
            error.param = name + error.param.removeprefix(chat_name)
            break
    return error


def _messages(instructions: str | None, items: list[Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    reasoning = ""  # an earlier turn's reasoning, waiting for that turn's assistant message
    for item in items:
        if isinstance(item, ReasoningItem):
            reasoning += item.text()
        elif isinstance(item, MessageItem) and item.role != "assistant":
            messages.append({"role": item.role, "content": item.text()})
        elif isinstance(item, MessageItem):
            turn = _assistant_turn(messages, reasoning)
            turn["content"] = (turn.get("content") or "") + item.text()
        elif isinstance(item, FunctionCallItem):
            turn = _assistant_turn(messages, reasoning)
            function = {"name": item.name, "arguments": item.arguments}
            turn.setdefault("tool_calls", []).append({"id": item.call_id, "type": "function", "function": function})
        elif isinstance(item, FunctionCallOutputItem):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        if not isinstance(item, ReasoningItem | SkippedItem):
            reasoning = ""
    if not any(message["role"] != "system" for message in messages):
        # An empty input (Codex's probe: input "", max_output_tokens 1) is still a turn to answer.
        messages.append({"role": "user", "content": ""})
    return messages


def _assistant_turn(messages: list[dict[str, Any]], reasoning: str) -> dict[str, Any]:
    """The assistant message this item belongs to: the last one, if nothing has answered it yet."""
    if not messages or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": None})
    if reasoning:
        messages[-1]["reasoning_content"] = messages[-1].get("reasoning_content", "") + reasoning
    return messages[-1]


def _skipped_items(items: list[Any]) -> list[ResponseWarning]:
    return [
        ResponseWarning(param=f"input[{i}]", message=f"item type {item.type!r} is not supported by Arbor; skipped")
        for i, item in enumerate(items)
        if isinstance(item, SkippedItem)
    ]


def _skipped_tools(req: ResponsesRequest) -> list[ResponseWarning]:
    return [
        ResponseWarning(param=f"tools[{i}]", message=f"tool type {tool.type!r} is not supported by Arbor; skipped")
        for i, tool in enumerate(req.tools or [])
        if isinstance(tool, HostedTool)
    ]


def _tool_choice(req: ResponsesRequest, warnings: list[ResponseWarning]) -> Any:
    choice = req.tool_choice
    if isinstance(choice, FunctionChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, HostedChoice):
        message = f"names tool type {choice.type!r}, which was skipped; 'auto' is used"
        warnings.append(ResponseWarning(param="tool_choice", message=message))
        return None
    return choice


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(include={"name", "description", "parameters", "strict"}, exclude_none=True)
    return {"type": "function", "function": function}


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    schema = req.json_schema()
    if schema is not None:
        spec = schema.model_dump(by_alias=True, exclude={"type"}, exclude_none=True)
        return {"type": "json_schema", "json_schema": spec}
    kind = req.text_format_type()
    return None if kind == "text" else {"type": kind}


def _reasoning(effort: Effort | None) -> dict[str, Any]:
    if effort is None:
        return {}
    if effort == "none":
        return {"reasoning_budget": 0, "chat_template_kwargs": {"enable_thinking": False}}
    return {"reasoning_budget": EFFORT_BUDGETS[effort]}


def _dump(item: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = item.model_dump(mode="json", exclude_none=True)
    return dumped
