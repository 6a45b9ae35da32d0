"""GET /openapi.json, generated from the pydantic request and response models."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.completion_bodies import (
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from gateway.messages_api.request import CountTokensRequest, MessagesRequest
from gateway.responses_api.objects import DeletedResponse, ResponseObject
from gateway.responses_api.request import ResponsesRequest
from shared.openai_schema import ChatCompletionRequest, CompletionRequest
from shared.tokenizer_api import DetokenizeRequest, TokenizeRequest

REF = "#/components/schemas/{model}"
_MODELS: list[tuple[type[BaseModel], Any]] = [
    (ChatCompletionRequest, "validation"),
    (CompletionRequest, "validation"),
    (MessagesRequest, "validation"),
    (CountTokensRequest, "validation"),
    (ChatCompletion, "serialization"),
    (ChatCompletionChunk, "serialization"),
    (Completion, "serialization"),
    (ModelList, "serialization"),
    (ModelCard, "serialization"),
    (ErrorResponse, "serialization"),
    (ResponsesRequest, "validation"),
    (ResponseObject, "serialization"),
    (DeletedResponse, "serialization"),
    (TokenizeRequest, "validation"),
    (DetokenizeRequest, "validation"),
]


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": REF.format(model=model.__name__)}


def _generation(
    summary: str, request: type[BaseModel], body: type[BaseModel], chunk: type[BaseModel]
) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {
                    "description": "A JSON body, or with stream=true server-sent events ending in [DONE]",
                    "content": {
                        "application/json": {"schema": _ref(body)},
                        "text/event-stream": {"schema": _ref(chunk)},
                    },
                },
                "default": {
                    "description": "An error",
                    "content": {"application/json": {"schema": _ref(ErrorResponse)}},
                },
            },
        }
    }


def _anthropic(summary: str, request: type[BaseModel]) -> dict[str, Any]:
    """The Messages API's replies are Anthropic's shapes, documented in docs/API.md."""
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {
                "200": {"description": "Anthropic's reply (JSON, or server-sent events with stream=true)"},
                "default": {"description": 'An error: {"type": "error", "error": {"type", "message"}}'},
            },
        }
    }


def _error_response() -> dict[str, Any]:
    return {"description": "An error", "content": {"application/json": {"schema": _ref(ErrorResponse)}}}


def _tokenizer(summary: str, request: type[BaseModel]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
            "responses": {"200": {"description": "OK"}, "default": _error_response()},
        }
    }


@cache
def build_openapi() -> dict[str, Any]:
    _, schemas = models_json_schema(_MODELS, ref_template=REF)
    plain = {"200": {"description": "OK"}, "503": {"description": "Not ready"}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Arbor", "version": "0.1.0", "description": "OpenAI-compatible LLM serving"},
        "paths": {
            "/v1/chat/completions": _generation(
                "Chat completion", ChatCompletionRequest, ChatCompletion, ChatCompletionChunk
            ),
            "/v1/completions": _generation("Text completion", CompletionRequest, Completion, Completion),
            "/v1/messages": _anthropic("Anthropic Messages API: a message, or its event stream", MessagesRequest),
            "/v1/messages/count_tokens": _anthropic("Anthropic's token count: {input_tokens}", CountTokensRequest),
            "/v1/models": {
                "get": {
                    "summary": "Served models",
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"application/json": {"schema": _ref(ModelList)}},
                        }
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One served model",
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"application/json": {"schema": _ref(ModelCard)}},
                        },
                        "404": {
                            "description": "No live worker serves it",
                            "content": {"application/json": {"schema": _ref(ErrorResponse)}},
                        },
                    },
                }
            },
            **_responses_paths(),
            "/tokenize": _tokenizer("vLLM's tokenize: {count, max_model_len, tokens, token_strs}", TokenizeRequest),
            "/detokenize": _tokenizer("vLLM's detokenize: {prompt}", DetokenizeRequest),
            "/tokenizer_info": {
                "get": {
                    "summary": "The tokenizer's special tokens, chat template and model_max_length",
                    "parameters": [{"name": "model", "in": "query", "required": False, "schema": {"type": "string"}}],
                    "responses": {"200": {"description": "OK"}, "default": _error_response()},
                }
            },
            "/health": {"get": {"summary": "Redis and at least one ready worker", "responses": plain}},
            "/livez": {"get": {"summary": "The process answers (liveness)", "responses": plain}},
            "/readyz": {"get": {"summary": "Redis answers (readiness)", "responses": plain}},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}},
        },
        "components": {"schemas": schemas.get("$defs", {})},
    }


def _responses_paths() -> dict[str, Any]:
    """/v1/responses: streamed, a sequence of `event: <type>` frames whose data carry the type and
    a `sequence_number` (docs/API.md lists them); stored responses by id."""
    errors = {"description": "An error", "content": {"application/json": {"schema": _ref(ErrorResponse)}}}
    by_id = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]

    def returning(summary: str, model: type[BaseModel], **extra: Any) -> dict[str, Any]:
        ok = {"description": "OK", "content": {"application/json": {"schema": _ref(model)}}}
        return {"summary": summary, **extra, "responses": {"200": ok, "default": errors}}

    create = returning(
        "A model response (OpenAI's Responses API)",
        ResponseObject,
        requestBody={"required": True, "content": {"application/json": {"schema": _ref(ResponsesRequest)}}},
    )
    create["responses"]["200"]["content"]["text/event-stream"] = {"schema": {"type": "object"}}
    return {
        "/v1/responses": {"post": create},
        "/v1/responses/{response_id}": {
            "get": returning("A stored response", ResponseObject, parameters=by_id),
            "delete": returning("Delete a stored response", DeletedResponse, parameters=by_id),
        },
    }


async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(build_openapi())
