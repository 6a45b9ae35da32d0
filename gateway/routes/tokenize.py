"""POST /tokenize, POST /detokenize, GET /tokenizer_info: vLLM's tokenizer endpoints.

Each is a "tokenize" job on the model's stream, answered by one of its workers from the model's
own tokenizer and chat template (shared/tokenizer_api.py says why); the reply is the job's final
`result`. They pass the same gates as generation: API keys (middleware), the body cap, admission
(a model with no live worker is a 503). `model` may be left out, as vLLM allows, when the fleet
serves one model; with several it names one. GET /tokenizer_info takes it as `?model=`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from redis.exceptions import RedisError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from gateway import errors
from gateway.delivery import ClientGone
from gateway.generation import Generation, GenerationFailed
from gateway.jobs import ID_PREFIXES
from gateway.middleware.disconnect import disconnect_watch
from gateway.routes.generate import CLIENT_CLOSED, opened, read_request
from gateway.services import Services
from shared.live_workers import live_workers
from shared.protocol import Job
from shared.tokenizer_api import DetokenizeRequest, TokenizeRequest, TokenizerJob

Body = TypeVar("Body", TokenizeRequest, DetokenizeRequest)


async def tokenize(request: Request) -> Response:
    return await _answered(request, "tokenize", TokenizeRequest)


async def detokenize(request: Request) -> Response:
    return await _answered(request, "detokenize", DetokenizeRequest)


async def tokenizer_info(request: Request) -> Response:
    svc: Services = request.state.services
    model = await _model(svc, request.query_params.get("model"))
    return await _run(svc, request, model, TokenizerJob(op="info"))


async def _answered(request: Request, op: str, model_type: type[Body]) -> Response:
    svc: Services = request.state.services
    try:
        raw = await read_request(request, svc.settings)
    except ClientDisconnect:
        return Response(status_code=CLIENT_CLOSED)
    body = _parse(svc, model_type, raw, f"/{op}")
    model = await _model(svc, body.model)
    job = TokenizerJob.model_validate({"op": op, op: body})
    return await _run(svc, request, model, job)


def _parse(svc: Services, model_type: type[Body], raw: bytes, route: str) -> Body:
    try:
        return svc.bodies.parse(model_type, raw, route)
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


async def _model(svc: Services, named: str | None) -> str:
    """The served model the request is for: as named (an alias resolved), or the only one."""
    if named is None:
        served = await _served_models(svc)
        if len(served) != 1:
            listed = ", ".join(sorted(served)) or "none"
            raise errors.invalid_request(f"model: name one of the served models ({listed})", "model")
        named = served.pop()
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            return await svc.admission.admit(named)
    except (RedisError, OSError, TimeoutError) as exc:
        raise errors.redis_unavailable(exc) from exc


async def _served_models(svc: Services) -> set[str]:
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            return {beat.model for beat in await live_workers(svc.redis)}
    except (RedisError, OSError, TimeoutError) as exc:
        raise errors.redis_unavailable(exc) from exc


async def _run(svc: Services, request: Request, model: str, body: BaseModel) -> Response:
    arrived = asyncio.get_running_loop().time()
    now = time.time()
    job = Job(
        id=svc.hub.request_id(ID_PREFIXES["tokenize"]),
        model=model,
        kind="tokenize",
        body=body.model_dump_json(exclude_none=True),
        created=now,
        deadline=now + svc.settings.request_timeout_s,
    )
    gen = Generation(svc, job, 1, disconnect_watch(request.scope), arrived)
    refused = await opened(gen)
    if refused is not None:
        return refused
    try:
        async for _ in gen.batches():
            pass
    except GenerationFailed as exc:
        return exc.error.response()
    except ClientGone:
        return Response(status_code=CLIENT_CLOSED)
    finally:
        await gen.close()
    result: dict[str, Any] | None = gen.outcome.choices[0].result
    if result is None:
        return errors.protocol_violation("a tokenize job ended without its result").response()
    return JSONResponse(result)
