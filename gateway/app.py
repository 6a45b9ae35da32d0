"""The Starlette app: routes, middleware, error envelopes, and the lifespan that owns Redis.

Middleware, outermost first: request metrics, auth, disconnect watch. Settings arrive typed from
the caller (`create_app(GatewaySettings())` at the process edge); nothing here reads os.environ.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from redis.asyncio import Redis
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.admission import Admission
from gateway.errors import ApiError
from gateway.hub import EventHub
from gateway.messages_api import errors as messages_errors
from gateway.messages_api.route import count_tokens, create_message
from gateway.metrics import GatewayMetrics
from gateway.middleware.auth import AuthMiddleware
from gateway.middleware.disconnect import DisconnectMiddleware
from gateway.middleware.request_metrics import RequestMetricsMiddleware
from gateway.openapi import openapi
from gateway.request_body import BodyParser
from gateway.responses_api.routes import create_response, delete_response, retrieve_response
from gateway.routes.generate import chat_completions, completions
from gateway.routes.health import health, livez, readyz
from gateway.routes.metrics import metrics
from gateway.routes.models import list_models, retrieve_model
from gateway.routes.tokenize import detokenize, tokenize, tokenizer_info
from gateway.services import Services
from shared.openai_schema import Limits
from shared.redis_connect import async_client
from shared.settings import GatewaySettings

log = logging.getLogger(__name__)

REDIS_MAX_CONNECTIONS = 128  # per gateway process; commands queue for one beyond that

ROUTES = [
    Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    Route("/v1/completions", completions, methods=["POST"]),
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", retrieve_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/v1/models/{model:path}", retrieve_model, methods=["GET"]),
    Route("/tokenize", tokenize, methods=["POST"]),
    Route("/detokenize", detokenize, methods=["POST"]),
    Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
    Route("/livez", livez, methods=["GET"]),
    Route("/readyz", readyz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
    Route("/openapi.json", openapi, methods=["GET"]),
]


def create_app(settings: GatewaySettings) -> Starlette:
    gateway_metrics = GatewayMetrics()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[dict[str, Services]]:
        redis = connect_redis(settings)
        hub = EventHub(redis, settings.redis_timeout_s)
        await hub.start()
        limits = Limits(max_tokens=settings.max_tokens_cap, max_n=settings.max_n, max_prompts=settings.max_prompts)
        try:
            admission = Admission(redis)
            bodies = BodyParser(settings.strict_request_fields, gateway_metrics.ignored_fields)
            yield {"services": Services(settings, redis, hub, gateway_metrics, limits, admission, bodies)}
        finally:
            await hub.stop()
            with anyio.move_on_after(settings.redis_timeout_s):
                await redis.aclose()

    def on_api_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        if exc.status < 500 or exc.code in ("no_ready_worker", "redis_unavailable"):
            gateway_metrics.rejections.labels(reason=exc.code).inc()
        return _in_envelope(request, exc)

    middleware = [
        Middleware(RequestMetricsMiddleware, http_requests=gateway_metrics.http_requests),
        Middleware(
            AuthMiddleware,
            api_keys=settings.api_keys,
            protect_ops=settings.auth_health_metrics,
            on_reject=lambda reason: gateway_metrics.rejections.labels(reason=reason).inc(),
        ),
        Middleware(DisconnectMiddleware, send_timeout_s=settings.client_timeout_s),
    ]
    handlers = {ApiError: on_api_error, HTTPException: on_http_error, Exception: on_crash}
    return Starlette(routes=ROUTES, middleware=middleware, exception_handlers=handlers, lifespan=lifespan)


def connect_redis(settings: GatewaySettings) -> Redis:
    """Connects lazily; a Redis that is down at start shows up in /health, not as a crash.

    Every request in flight holds a connection while it waits on Redis, and redis-py's pool fails
    a command at once, with MaxConnectionsError, when all of its connections are out: 64
    streaming clients hit that. A blocking pool makes a
    command wait for a free connection instead, up to the Redis timeout."""
    return async_client(settings.redis_url, settings.redis_timeout_s, max_connections=REDIS_MAX_CONNECTIONS)


def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    code = codes.get(exc.status_code, "http_error")
    error = ApiError(exc.status_code, str(exc.detail), code, headers=exc.headers)
    return _in_envelope(request, error)


def on_crash(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s", request.url.path, exc_info=exc)
    return _in_envelope(request, ApiError(500, "Internal server error", "internal_error"))


def _in_envelope(request: Request, error: ApiError) -> JSONResponse:
    """Anthropic's error envelope on its API's paths, OpenAI's everywhere else."""
    if messages_errors.is_messages_path(request.url.path):
        return messages_errors.response(error)
    return error.response()
