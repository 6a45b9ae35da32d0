"""POST /v1/messages and /v1/messages/count_tokens: validate, translate, admit, enqueue, reply.

Both go the chat route's way (`gateway.routes.generate`): the body read under the size cap and the
client timeout, admission, one job on the model's stream (subscribed first), a `Generation` that
owns its cancellation and deadline. Only the request's shape and the reply's differ. Errors, the
gateway's own included, reach the client in Anthropic's envelope (`gateway.app` picks it by path).

count_tokens needs the model's chat template and tokenizer, which only a worker has (the gateway
never loads a model), so it is a job of kind "count" on the same stream: the worker renders and
tokenizes the prompt as it would for generation, publishes one final event with the count and
generates nothing. Counting therefore equals the `input_tokens` a generation of the same request
reports, by construction, whatever the template.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from gateway import errors
from gateway.delivery import ClientGone
from gateway.generation import Generation, GenerationFailed
from gateway.jobs import new_job
from gateway.messages_api import errors as messages_errors
from gateway.messages_api import reply
from gateway.messages_api.request import CountTokensRequest, MessagesRequest
from gateway.messages_api.stream import MessageStream, sse_event
from gateway.messages_api.translate import count_request, to_chat_request
from gateway.middleware.disconnect import disconnect_watch
from gateway.routes.generate import CLIENT_CLOSED, GenerationStream, admitted, opened, read_request
from gateway.services import Services
from shared.openai_schema import ChatCompletionRequest
from shared.protocol import JobKind

Body = TypeVar("Body", bound=BaseModel)


async def create_message(request: Request) -> Response:
    svc: Services = request.state.services
    arrived = asyncio.get_running_loop().time()
    try:
        raw = await read_request(request, svc.settings)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    req = _parse(svc, MessagesRequest, raw, "/v1/messages")
    chat = await admitted(svc, _translated(lambda: to_chat_request(req, svc.limits)), request)
    gen = await _opened(svc, request, "chat", chat, arrived)
    if isinstance(gen, Response):
        return gen
    if req.stream:
        return GenerationStream(gen, _events(gen, MessageStream(gen.job.id, chat.model)))
    outcome = await _finished(gen)
    if isinstance(outcome, Response):
        return outcome
    return JSONResponse(reply.message(gen.job.id, chat.model, gen.outcome.choices[0]))


async def count_tokens(request: Request) -> Response:
    svc: Services = request.state.services
    arrived = asyncio.get_running_loop().time()
    try:
        raw = await read_request(request, svc.settings)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    req = _parse(svc, CountTokensRequest, raw, "/v1/messages/count_tokens")
    chat = await admitted(svc, _translated(lambda: count_request(req, svc.limits)), request)
    gen = await _opened(svc, request, "count", chat, arrived)
    if isinstance(gen, Response):
        return gen
    outcome = await _finished(gen)
    if isinstance(outcome, Response):
        return outcome
    return JSONResponse({"input_tokens": gen.outcome.choices[0].prompt_tokens})


def _parse(svc: Services, model: type[Body], raw: bytes, route: str) -> Body:
    try:
        return svc.bodies.parse(model, raw, route)
    except ValidationError as exc:
        raise messages_errors.invalid_request(exc) from None


def _translated(make: Callable[[], ChatCompletionRequest]) -> ChatCompletionRequest:
    """The chat request, or a 400 for what only the chat rules refuse (a forced tool that is not
    in `tools`, a schema the grammar engine cannot compile, a limit)."""
    try:
        return make()
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


async def _opened(
    svc: Services, request: Request, kind: JobKind, chat: ChatCompletionRequest, arrived: float
) -> Generation | Response:
    settings = svc.settings
    job = new_job(kind, chat, settings.default_max_tokens, settings.request_timeout_s, svc.hub.request_id)
    gen = Generation(svc, job, 1, disconnect_watch(request.scope), arrived)
    refused = await opened(gen, messages_errors.response)
    return gen if refused is None else refused


async def _finished(gen: Generation) -> Response | None:
    """Waits for the job's end; a Response when it did not end well."""
    try:
        async for _ in gen.batches():
            pass
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    except GenerationFailed as exc:
        return messages_errors.response(exc.error)
    finally:
        await gen.close()
    return None


async def _events(gen: Generation, stream: MessageStream) -> AsyncIterator[bytes]:
    """One write per batch of job events, as the chat stream does; a failure after the start is
    Anthropic's `error` event."""
    try:
        async for batch in gen.batches():
            data = b"".join(sse_event(*out) for event in batch for out in stream.events(event))
            if data:
                yield data
    except ClientGone:
        return
    except GenerationFailed as exc:
        yield sse_event("error", messages_errors.body(exc.error))
