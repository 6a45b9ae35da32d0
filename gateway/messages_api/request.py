"""The body of `POST /v1/messages`, as Anthropic documents it and Claude Code sends it.

What cannot change the answer is accepted and ignored: `cache_control` on any block, `metadata`,
`service_tier`, `container`, `mcp_servers`, `context_management`, a thinking block's `signature`,
`redacted_thinking` blocks, and any field a newer client adds, at any depth (`shared.request_fields`:
logged and counted; under `ARBOR_STRICT_REQUEST_FIELDS` a 400 below the top level, where
unknown fields were always ignored). What would change it and Arbor cannot do (images, documents, a block
type it does not know) is refused by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from shared.priority import MAX_PRIORITY, MIN_PRIORITY
from shared.request_fields import Lenient

TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"  # the chat route's function-name rule
_UNSUPPORTED_BLOCKS = {
    "image": "image blocks are not supported: Arbor serves text-only models",
    "document": "document blocks are not supported: send the document's text in a text block",
    "search_result": "search_result blocks are not supported",
}


class _Block(Lenient):
    cache_control: dict[str, Any] | None = None  # prompt caching is automatic here: ignored


class TextBlock(_Block):
    type: Literal["text"]
    text: str
    citations: list[Any] | None = None  # replayed from earlier answers; ignored


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[TextBlock] = ""
    is_error: bool = False


class ThinkingBlock(_Block):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Anthropic's integrity check of its own thinking: nothing to check here


class RedactedThinkingBlock(_Block):
    type: Literal["redacted_thinking"]
    data: str


class UnsupportedBlock(BaseModel):
    """A block type Arbor refuses: one error saying why, not one per field it lacks."""

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, value: Any) -> Any:
        raise ValueError(_UNSUPPORTED_BLOCKS[value["type"]])


def _block_kind(value: Any) -> str | None:
    """The union's tag: the block's type (an unknown one is a tag error naming the known ones)."""
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "unsupported" if kind in _UNSUPPORTED_BLOCKS else kind if isinstance(kind, str) else None


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[UnsupportedBlock, Tag("unsupported")],
    Discriminator(
        _block_kind,
        custom_error_type="invalid_block_type",
        custom_error_message="a block's type must be text, tool_use, tool_result, thinking or redacted_thinking",
    ),
]


def _content_kind(value: Any) -> str:
    return "blocks" if isinstance(value, list) else "text"


# A callable discriminator, so a bad block reports the block's error, not "should be a string".
Content = Annotated[
    Annotated[str, Tag("text")] | Annotated[list[ContentBlock], Tag("blocks")], Discriminator(_content_kind)
]


class InputMessage(Lenient):
    """A turn. `system` entries (Claude Code sends them among the turns) join the system prompt."""

    role: Literal["user", "assistant", "system"]
    content: Content


class ToolDefinition(Lenient):
    """A client tool. A server tool (`type` like "web_search_20250305") runs on Anthropic's side,
    which Arbor is not: such tools are dropped (`is_client_tool`), not refused."""

    refused_when_strict = False  # a server tool's own fields (max_uses, ...)

    name: str = Field(pattern=TOOL_NAME_PATTERN)
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None

    @property
    def is_client_tool(self) -> bool:
        return self.type in (None, "custom")


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # with type "tool"
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named_when_tool(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("name is required when type is 'tool'")
        return self


class ThinkingConfig(Lenient):
    """enabled: think, at most `budget_tokens` tokens; disabled: do not; adaptive: the model's own
    default (Arbor has no effort model to adapt)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=0)
    # How thinking is shown: the model's own text is always returned, so both are the same here
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> ThinkingConfig:
        if self.type == "enabled" and self.budget_tokens is None:
            raise ValueError("budget_tokens is required when type is 'enabled'")
        return self


class OutputFormat(Lenient):
    """`{"type": "json_schema", "schema": {...}}`: the answer is JSON that validates, enforced token
    by token (the chat route's `response_format`)."""

    model_config = ConfigDict(populate_by_name=True)

    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Lenient):
    """`effort` is a hint for Anthropic's models (accepted, not used: `thinking` sets the budget);
    `format` constrains the answer."""

    effort: Literal["low", "medium", "high", "max"] | None = None
    format: OutputFormat | None = None


class MessagesRequest(Lenient):
    refused_when_strict = False

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    # Anthropic's server-side clearing of old tool results: Arbor keeps the conversation as sent
    context_management: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None  # user_id: a tag; used by nothing
    seed: int | None = None  # Arbor's, as on the chat route: reproducible sampling (not Anthropic's)
    ignore_eos: bool = False  # Arbor's (vLLM's), as on the chat route: run to max_tokens (benchmarks)
    priority: int | None = Field(None, ge=MIN_PRIORITY, le=MAX_PRIORITY)  # Arbor's (vLLM's), as on chat


class CountTokensRequest(Lenient):
    """`POST /v1/messages/count_tokens`: a messages request without max_tokens or sampling."""

    refused_when_strict = False

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    context_management: dict[str, Any] | None = None
