"""The response object of /v1/responses and its output items, as OpenAI returns them.

Dumped whole (`dump_response`), nulls included: OpenAI sends every field of the object, and
clients read `incomplete_details` or `error` as null when there is none. `warnings` is Arbor's
own field: what the request asked for that Arbor skipped (hosted tools, their replayed calls);
OpenAI's SDK keeps unknown fields, so `response.warnings` reads them (`model_extra` in pydantic).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.responses_api.request import ResponsesRequest

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["in_progress", "completed", "incomplete", "failed"]


def new_item_id(prefix: str) -> str:
    """OpenAI's item id shapes: msg_..., fc_..., rs_..."""
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class MessageOutput(BaseModel):
    type: Literal["message"] = "message"
    id: str
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "in_progress"
    content: list[OutputText] = Field(default_factory=list)


class FunctionCallOutput(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str = ""
    status: ItemStatus = "in_progress"


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str = ""


class ReasoningOutput(BaseModel):
    """The model's reasoning text as `content`; `summary` stays empty (Arbor writes no summaries)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)
    status: ItemStatus = "in_progress"


OutputItem = MessageOutput | FunctionCallOutput | ReasoningOutput


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseError(BaseModel):
    code: str
    message: str


class ResponseWarning(BaseModel):
    """Something the request asked for that Arbor skipped; `param` names it (`tools[2]`)."""

    param: str
    message: str


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: ResponseStatus = "in_progress"
    completed_at: int | None = None
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=dict)
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any] = Field(default_factory=dict)
    tool_choice: Any = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_p: float = 1.0
    truncation: Literal["auto", "disabled"] = "disabled"
    user: str | None = None
    background: bool = False
    service_tier: str = "default"
    warnings: list[ResponseWarning] = Field(default_factory=list)


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response.deleted"] = "response.deleted"
    deleted: bool = True


def dump_response(response: ResponseObject) -> dict[str, Any]:
    """Every field, nulls included: the response object always carries its whole shape."""
    return response.model_dump(mode="json")


def new_response(
    response_id: str, created_at: int, req: ResponsesRequest, warnings: list[ResponseWarning]
) -> ResponseObject:
    """The response object in progress: the request's settings echoed, as OpenAI echoes them."""
    reasoning = req.reasoning.model_dump(exclude={"generate_summary"}) if req.reasoning else {}
    text_format = req.text.format if req.text is not None else None
    choice = req.tool_choice
    return ResponseObject(
        id=response_id,
        created_at=created_at,
        model=req.model,
        instructions=req.instructions,
        max_output_tokens=req.max_output_tokens,
        max_tool_calls=req.max_tool_calls,
        metadata=req.metadata or {},
        parallel_tool_calls=req.parallel_tool_calls is not False,
        previous_response_id=req.previous_response_id,
        reasoning={"effort": None, "summary": None} | reasoning,
        store=req.store,
        temperature=1.0 if req.temperature is None else req.temperature,
        text={"format": text_format.model_dump(by_alias=True) if text_format else {"type": "text"}},
        tool_choice=choice.model_dump() if isinstance(choice, BaseModel) else choice or "auto",
        tools=[tool.model_dump(exclude_none=True) for tool in req.function_tools()],
        top_p=1.0 if req.top_p is None else req.top_p,
        truncation=req.truncation or "disabled",
        user=req.user,
        warnings=warnings,
    )
