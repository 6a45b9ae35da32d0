"""Anthropic's error envelope: {"type": "error", "error": {"type": ..., "message": ...}}.

The gateway's errors (`gateway.errors.ApiError`) keep their status; only the body's shape and the
type names change, so the anthropic SDK raises the exception class it would for Anthropic itself.
Every error on a /v1/messages path is sent this way, 401 and crashes included (`is_messages_path`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from gateway import errors
from gateway.errors import ApiError

PATH = "/v1/messages"

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",  # no ready worker, Redis away: Anthropic's "try again shortly"
    529: "overloaded_error",
}


# The tags of the tagged unions in `request.py`, which pydantic puts into an error's location:
# "messages.0.content.blocks.0.unsupported" is the field "messages.0.content.0", and
# "messages.0.content.blocks.0.text.text" is "messages.0.content.0.text".
_CONTENT_TAG = re.compile(r"(?<=\.content)\.(?:blocks(?=\.)|text(?![.\w]))")
_BLOCK_TAG = re.compile(r"(\.content\.\d+)\.(?:text|tool_use|tool_result|thinking|redacted_thinking|unsupported)\b")


def _untagged(text: str) -> str:
    return _BLOCK_TAG.sub(r"\1", _CONTENT_TAG.sub("", text))


def invalid_request(exc: ValidationError) -> ApiError:
    """A 400 naming the fields as the client wrote them, without the unions' tags."""
    error = errors.from_validation(exc)
    error.message = _untagged(error.message)
    error.param = _untagged(error.param) if error.param else None
    return error


def is_messages_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def body(error: ApiError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type(error.status), "message": error.message}}


def response(error: ApiError) -> JSONResponse:
    return JSONResponse(body(error), status_code=error.status, headers=error.headers)
