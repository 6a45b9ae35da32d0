"""The body of POST /v1/responses, validated as strictly as the chat body, in the Responses shape.

A field Arbor does not know is ignored at any depth (`shared.request_fields`: logged and
counted). Under `ARBOR_STRICT_REQUEST_FIELDS` it is a 400 naming it, except in input items:
items are what clients replay from earlier outputs (ids, statuses, annotations,
`encrypted_content`, `phase`), and none of those changes the answer.
Item *types* Arbor cannot run (hosted tools' calls) are kept as `SkippedItem` and dropped with
a warning by the translation; an unknown item type is a 400 naming `input.N.type`.

Tools follow the same rule: a `function` tool is validated, any other type (web_search,
file_search, computer_use_preview, code_interpreter, image_generation, local_shell, mcp,
custom, ...) is a `HostedTool`, skipped with a warning (vLLM refuses them; Codex sends them on
every request, so a refusal would make Arbor unusable from it).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from shared.openai_schema import Limits, UnsupportedField, one_service_tier
from shared.priority import MAX_PRIORITY, MIN_PRIORITY
from shared.request_fields import Lenient
from shared.structured_output import StructuredOutputError, json_schema_output

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]

# Input item types that record a hosted or custom tool's call: replayed history Arbor cannot
# reproduce (it never runs those tools), skipped with a warning like the tools themselves.
SKIPPED_ITEM_TYPES = frozenset(
    {
        "web_search_call",
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "custom_tool_call",
        "custom_tool_call_output",
        "tool_search_call",
        "tool_search_output",
        "compaction",
    }
)


class _Item(Lenient):
    refused_when_strict = False


class TextContent(_Item):
    """`input_text` (what a client writes) or `output_text` (an earlier answer, replayed)."""

    type: Literal["input_text", "output_text"]
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        kind = value.get("type") if isinstance(value, dict) else None
        if isinstance(kind, str) and kind not in ("input_text", "output_text"):
            raise ValueError(f"content part type {kind!r} is not supported; only 'input_text' and 'output_text' are")
        return value


def _as_parts(value: Any) -> Any:
    """A string is one text part, so a bad list reports the list's error, not "not a string"."""
    if isinstance(value, str):
        return [{"type": "input_text", "text": value}]
    if not isinstance(value, list):
        raise ValueError("must be a string or a list of text parts")
    return value


class MessageItem(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: list[TextContent]

    _parts = field_validator("content", mode="before")(_as_parts)

    def text(self) -> str:
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Item):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str  # JSON text, as the model wrote it


class FunctionCallOutputItem(_Item):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: list[TextContent]

    _parts = field_validator("output", mode="before")(_as_parts)

    def text(self) -> str:
        return "".join(part.text for part in self.output)


class ReasoningPart(_Item):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Item):
    """An earlier turn's reasoning. Its `content` (raw reasoning text, what Arbor returns) becomes
    that turn's reasoning for templates that render it; a summary or `encrypted_content` is
    accepted and not used (neither is the model's own text)."""

    type: Literal["reasoning"]
    content: list[ReasoningPart] | None = None
    summary: list[ReasoningPart] = Field(default_factory=list)

    def text(self) -> str:
        return "".join(part.text for part in self.content or [] if part.type == "reasoning_text")


class _Skipped(BaseModel):
    """Something skipped as a whole, with a warning: its own fields are not unknown fields."""

    model_config = ConfigDict(extra="ignore", strict=True)


class SkippedItem(_Skipped):
    type: str


def _item_kind(value: Any) -> str:
    kind = value.get("type", "message") if isinstance(value, dict) else "message"
    if kind in SKIPPED_ITEM_TYPES:
        return "skipped"
    return kind if isinstance(kind, str) else "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[SkippedItem, Tag("skipped")],
    Discriminator(
        _item_kind,
        custom_error_type="input_item_type",
        custom_error_message="unknown item type; expected message, function_call, function_call_output or reasoning",
    ),
]


class FunctionTool(Lenient):
    """The flat shape: {type, name, description, parameters, strict} (no `function` wrapper)."""

    type: Literal["function"]
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None  # a hint for OpenAI's tool search; every tool is loaded here


class HostedTool(_Skipped):
    """A tool OpenAI runs on its side (or a custom/grammar tool): skipped with a warning."""

    type: str


def _tool_kind(value: Any) -> str:
    return "function" if isinstance(value, dict) and value.get("type") == "function" else "hosted"


Tool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


class FunctionChoice(Lenient):
    type: Literal["function"]
    name: str


class HostedChoice(_Skipped):
    """`{"type": "web_search_preview"}` and the like: names a skipped tool, so treated as auto."""

    type: str

    @field_validator("type")
    @classmethod
    def _not_allowed_tools(cls, value: str) -> str:
        if value == "allowed_tools":
            raise UnsupportedField("tool_choice", "'allowed_tools' is not supported; send only the tools to allow")
        return value


def _choice_kind(value: Any) -> str:
    if isinstance(value, str):
        return "mode"
    return "function" if isinstance(value, dict) and value.get("type") == "function" else "hosted"


ToolChoice = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("mode")]
    | Annotated[FunctionChoice, Tag("function")]
    | Annotated[HostedChoice, Tag("hosted")],
    Discriminator(_choice_kind),
]


class PlainText(Lenient):
    type: Literal["text"]


class JsonObject(Lenient):
    type: Literal["json_object"]


class JsonSchema(Lenient):
    """Enforced token by token whether `strict` is true or not, as on chat."""

    model_config = ConfigDict(populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[PlainText | JsonObject | JsonSchema, Field(discriminator="type")]


class TextConfig(Lenient):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # a hint for OpenAI's models; not used


class ReasoningConfig(Lenient):
    effort: Effort | None = None
    # Arbor returns the model's reasoning text itself (`reasoning_text`), never a summary of it.
    summary: Literal["auto", "concise", "detailed", "none"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesStreamOptions(Lenient):
    include_obfuscation: bool | None = None  # nothing is obfuscated: accepted either way


class ResponsesRequest(Lenient):
    model: str = Field(min_length=1)
    input: list[InputItem] = Field(default_factory=list, description="a string (one user message) or items")
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: int | None = Field(None, ge=0)  # bounds calls of hosted tools, which never run here
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_logprobs: int | None = Field(None, ge=0, le=20)
    seed: int | None = None  # Arbor's (as on chat): a seeded sample is reproducible
    ignore_eos: bool = False  # Arbor's (vLLM's), as on chat: run to max_output_tokens (benchmarks)
    priority: int | None = Field(None, ge=MIN_PRIORITY, le=MAX_PRIORITY)  # Arbor's (vLLM's), as on chat
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    store: bool = True
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    background: bool | None = None
    include: list[str] | None = None  # e.g. reasoning.encrypted_content: nothing is encrypted here
    truncation: Literal["auto", "disabled"] | None = None  # Arbor never drops items; too long is a 400
    metadata: dict[str, str] | None = Field(None, max_length=16)
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # the prefill cache needs no key: a shared prefix is found
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    service_tier: str | None = None
    conversation: Any = None
    prompt: Any = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_is_a_user_message(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "message", "role": "user", "content": value}] if value else []
        if not isinstance(value, list):
            raise ValueError("must be a string or a list of items")
        return value

    @field_validator("max_output_tokens")
    @classmethod
    def _within_cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        """Lowered to the cap, as chat's max_tokens is (the worker lowers it to what fits)."""
        limits: Limits | None = (info.context or {}).get("limits")
        if value is not None and limits is not None:
            return min(value, limits.max_tokens)
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _no_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise UnsupportedField("top_logprobs", "is not supported on /v1/responses (chat completions has logprobs)")
        return value

    @field_validator("background")
    @classmethod
    def _foreground(cls, value: bool | None) -> bool | None:
        if value:
            raise UnsupportedField("background", "true is not supported: responses are answered while you wait")
        return value

    @field_validator("service_tier")
    @classmethod
    def _one_tier(cls, value: str | None) -> str | None:
        return one_service_tier(value)

    @field_validator("conversation", "prompt")
    @classmethod
    def _not_supported(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            hint = "; use previous_response_id" if info.field_name == "conversation" else ""
            raise UnsupportedField(str(info.field_name), f"is not supported{hint}")
        return value

    @model_validator(mode="after")
    def _format_compiles(self) -> ResponsesRequest:
        """Checked here so that errors name `text.format`; the chat validation sees it valid."""
        schema = self.json_schema()
        if schema is not None:
            try:
                json_schema_output(schema.schema_, "text.format.schema").check()
            except StructuredOutputError as error:
                raise UnsupportedField(error.field, str(error).removeprefix(f"{error.field}: ")) from None
        if self.text_format_type() != "text" and self.function_tools() and self.tool_choice != "none":
            message = "cannot be combined with function tools (unless tool_choice is 'none')"
            raise UnsupportedField("text.format", message)
        return self

    def items(self) -> list[Any]:
        return list(self.input)

    def function_tools(self) -> list[FunctionTool]:
        return [tool for tool in self.tools or [] if isinstance(tool, FunctionTool)]

    def text_format_type(self) -> str:
        text_format = self.text.format if self.text is not None else None
        return "text" if text_format is None else text_format.type

    def json_schema(self) -> JsonSchema | None:
        text_format = self.text.format if self.text is not None else None
        return text_format if isinstance(text_format, JsonSchema) else None

    def effort(self) -> Effort | None:
        return self.reasoning.effort if self.reasoning is not None else None
