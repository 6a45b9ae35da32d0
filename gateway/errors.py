"""Every error the gateway returns, in the OpenAI envelope {"error": {message, type, param, code}}.

`code` doubles as the rejection reason in metrics (`arbor_rejections_total{reason=code}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from shared.openai_schema import UnsupportedField
from shared.protocol import ErrorCode, ErrorEvent

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}

_WORKER_STATUS = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorCode.DEADLINE_EXCEEDED: 504,
}

_MAX_LISTED_ERRORS = 5


class ApiError(Exception):
    """An error that ends a request with `status` and the OpenAI error envelope."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, dict[str, str | None]]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def from_validation(exc: ValidationError) -> ApiError:
    """400 naming the offending fields; the first one becomes `param`."""
    errors = exc.errors()
    param = _param(errors[0])
    messages = [_describe(error) for error in errors[:_MAX_LISTED_ERRORS]]
    if len(errors) > _MAX_LISTED_ERRORS:
        messages.append(f"... and {len(errors) - _MAX_LISTED_ERRORS} more")
    return invalid_request("; ".join(messages), param)


def _param(error: Mapping[str, Any]) -> str | None:
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, UnsupportedField):
        return cause.param
    return ".".join(str(part) for part in error["loc"]) or None


def _describe(error: Mapping[str, Any]) -> str:
    param = _param(error)
    text = str(error["msg"]).removeprefix("Value error, ")
    if error["type"] == "json_invalid":
        return f"Invalid JSON body: {error['ctx']['error']}"
    if error["type"] == "extra_forbidden":
        return f"Unknown field {param!r}"
    if error["type"] == "model_type" and not error["loc"]:
        return "The request body must be a JSON object"
    if isinstance(error.get("ctx", {}).get("error"), UnsupportedField) or param is None:
        return text
    return f"{param}: {text}"


def unauthorized() -> ApiError:
    message = "Invalid or missing API key (send 'Authorization: Bearer <key>' or 'x-api-key: <key>')"
    return ApiError(401, message, "invalid_api_key")


def body_too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"The request body exceeds the limit of {max_bytes} bytes", "request_too_large")


def body_timeout(timeout_s: float) -> ApiError:
    return ApiError(408, f"The request body did not arrive within {timeout_s:g} s", "request_timeout")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist.", "model_not_found", "model")


def no_ready_worker(model: str | None) -> ApiError:
    target = f"model `{model}`" if model else "any model"
    return ApiError(503, f"No ready worker for {target}; retry shortly", "no_ready_worker")


def queue_full(model: str, depth: int, retry_after_s: int) -> ApiError:
    message = f"The queue for model `{model}` is full ({depth} jobs waiting or running); retry later"
    return ApiError(429, message, "queue_full", headers={"Retry-After": str(retry_after_s)})


def redis_unavailable(exc: BaseException) -> ApiError:
    return ApiError(503, f"The request queue is unavailable: {type(exc).__name__}", "redis_unavailable")


def redis_no_replica(min_replicas: int) -> ApiError:
    message = (
        f"No Redis replica confirmed the request (ARBOR_REDIS_MIN_REPLICAS={min_replicas}): it was not "
        "accepted, so a failover cannot lose it; send it again"
    )
    return ApiError(503, message, "redis_no_replica")


def job_lost() -> ApiError:
    return ApiError(503, "The request was lost by the queue (did Redis restart?); send it again", "job_lost")


def timed_out(timeout_s: float) -> ApiError:
    return ApiError(504, f"The request did not finish within {timeout_s:g} s", "timeout")


def from_worker(event: ErrorEvent) -> ApiError:
    return ApiError(_WORKER_STATUS.get(event.code, 500), event.message, event.code)


def protocol_violation(detail: str) -> ApiError:
    return ApiError(500, f"The worker sent an invalid event: {detail}", ErrorCode.INTERNAL_ERROR)
