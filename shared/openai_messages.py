"""Chat messages and tools as OpenAI (and vLLM) clients send them. Text only: other parts -> 400."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, model_validator

from shared.request_fields import Lenient


class TextPart(Lenient):
    type: Literal["text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        """An image or audio part is one error naming its type, not three about its fields."""
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind != "text":
            raise ValueError(f"content part type {kind!r} is not supported; only 'text' parts are")
        return value


def _content_kind(value: Any) -> str:
    return "list" if isinstance(value, list) else "str"


# A callable discriminator, so a bad list reports the list's error, not "should be a string".
Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[TextPart], Tag("list")],
    Discriminator(_content_kind),
]


# Between a message's text parts (OpenAI) or text blocks (Messages): the worker renders one string
# a message for the chat template, joined as vLLM joins text parts for text-only models, so one
# conversation gives one prompt on either API.
TEXT_PART_SEPARATOR = "\n"


class ToolCallFunction(Lenient):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(Lenient):
    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class SystemMessage(Lenient):
    role: Literal["system", "developer"]
    content: Content
    name: str | None = None


class UserMessage(Lenient):
    role: Literal["user"]
    content: Content
    name: str | None = None


class AssistantMessage(Lenient):
    role: Literal["assistant"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: str | None = None  # earlier turns' reasoning, for templates that use it


class ToolMessage(Lenient):
    role: Literal["tool"]
    content: Content
    tool_call_id: str


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class FunctionDefinition(Lenient):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # JSON Schema
    strict: bool | None = None


class Tool(Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["auto", "none", "required"] | NamedToolChoice
