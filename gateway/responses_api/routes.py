"""POST /v1/responses, GET and DELETE /v1/responses/{response_id}.

POST takes the chat route's path from end to end: the body is read under the same size cap and
timeout, validated (a 400 naming the field; nothing is queued), translated into a chat job
(`translate.py`), admitted, enqueued and delivered by the same `Generation`, so deadlines,
cancellation on disconnect and the request metrics hold as they do for chat. Only the replies
differ: `assembler.py` turns the events into output items and, streaming, into the Responses
event sequence, framed as OpenAI frames it (`event: <type>` and `data: <json>`, no `[DONE]`).

A failure before the first byte is a plain HTTP error in the OpenAI envelope, as on chat; after
it, one `response.failed` event carrying the error ends the stream.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from gateway import errors
from gateway.delivery import ClientGone
from gateway.errors import ApiError
from gateway.generation import Generation, GenerationFailed
from gateway.jobs import new_job
from gateway.middleware.disconnect import disconnect_watch
from gateway.responses_api.assembler import ResponseAssembler, StreamEvent
from gateway.responses_api.objects import DeletedResponse, ResponseObject, dump_response, new_response
from gateway.responses_api.request import ResponsesRequest
from gateway.responses_api.store import ResponseStore, previous_response_not_found, response_not_found
from gateway.responses_api.translate import Translation, translate
from gateway.routes.generate import CLIENT_CLOSED, GenerationStream, admitted, opened, read_request
from gateway.services import Services
from shared.openai_schema import Limits, limits_context

log = logging.getLogger(__name__)

RESPONSE_ID_PREFIX = "resp"


@dataclass(frozen=True, slots=True)
class _Saver:
    """Stores a finished response when the request asked for it (`store`, true by default)."""

    store: ResponseStore
    enabled: bool
    input_items: list[dict[str, Any]]

    async def save(self, response: ResponseObject) -> None:
        if self.enabled:
            await self.store.save(response, self.input_items)


async def create_response(request: Request) -> Response:
    svc: Services = request.state.services
    arrived = asyncio.get_running_loop().time()
    try:
        raw = await read_request(request, svc.settings)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    req = parse_request(raw, svc)
    store = _store(svc)
    translation = await _translated(req, store, svc.limits)
    chat = await admitted(svc, translation.chat, request)
    job = new_job(
        "chat",
        chat,
        svc.settings.default_max_tokens,
        svc.settings.request_timeout_s,
        lambda _prefix: svc.hub.request_id(RESPONSE_ID_PREFIX),
    )
    if len(job.body) > svc.settings.max_body_bytes:  # a long previous_response_id chain
        raise _conversation_too_large(svc.settings.max_body_bytes, req.previous_response_id is not None)
    _log_warnings(job.id, translation)
    assembler = ResponseAssembler(new_response(job.id, int(job.created), req, translation.warnings))
    saver = _Saver(store, req.store, translation.items)
    gen = Generation(svc, job, 1, disconnect_watch(request.scope), arrived)
    refused = await opened(gen)
    if refused is not None:
        return refused
    if req.stream:
        return GenerationStream(gen, _stream(gen, assembler, saver))
    return await _whole(gen, assembler, saver)


async def retrieve_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    stored = await _store(request.state.services).load(response_id)
    if stored is None:
        raise response_not_found(response_id)
    return JSONResponse(stored.response)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    if not await _store(request.state.services).delete(response_id):
        raise response_not_found(response_id)
    return JSONResponse(DeletedResponse(id=response_id).model_dump(mode="json"))


def parse_request(raw: bytes, svc: Services) -> ResponsesRequest:
    try:
        return svc.bodies.parse(ResponsesRequest, raw, "/v1/responses", limits_context(svc.limits))
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


def _store(svc: Services) -> ResponseStore:
    return ResponseStore(svc.redis, svc.settings.responses_ttl_s, svc.settings.redis_timeout_s)


async def _translated(req: ResponsesRequest, store: ResponseStore, limits: Limits) -> Translation:
    previous_items: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        previous = await store.load(req.previous_response_id)
        if previous is None:
            raise previous_response_not_found(req.previous_response_id)
        previous_items = previous.conversation()
    return translate(req, previous_items, limits)


def _conversation_too_large(max_bytes: int, continued: bool) -> ApiError:
    if not continued:
        return errors.body_too_large(max_bytes)
    message = f"The conversation, with the previous response's, exceeds the limit of {max_bytes} bytes"
    return ApiError(413, message, "request_too_large", "previous_response_id")


def _log_warnings(response_id: str, translation: Translation) -> None:
    for warning in translation.warnings:
        log.info("%s: %s: %s", response_id, warning.param, warning.message)


async def _stream(gen: Generation, assembler: ResponseAssembler, saver: _Saver) -> AsyncIterator[bytes]:
    """One write per batch of protocol events, as on chat; the last one carries the terminal event."""
    try:
        yield _frames(assembler.opening())
        async for batch in gen.batches():
            events = [out for event in batch for out in assembler.add(event)]
            if gen.finished:
                await saver.save(assembler.response)
                events += assembler.terminal()
            if events:
                yield _frames(events)
    except ClientGone:
        return
    except GenerationFailed as exc:
        yield _frames(assembler.failed(exc.error))
    except ApiError as exc:  # the store failed: the answer cannot be continued as promised
        yield _frames(assembler.failed(exc))


async def _whole(gen: Generation, assembler: ResponseAssembler, saver: _Saver) -> Response:
    try:
        async for batch in gen.batches():
            for event in batch:
                assembler.add(event)
        await saver.save(assembler.response)
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    except GenerationFailed as exc:
        return exc.error.response()
    finally:
        await gen.close()
    return JSONResponse(dump_response(assembler.response))


def _frames(events: list[StreamEvent]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode() for event in events
    )
