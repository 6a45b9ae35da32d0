"""GET /v1/models (every model a live worker serves, from heartbeats) and GET /v1/models/{model}
(one of them, or 404 model_not_found, as OpenAI's retrieve). A model's aliases are listed as
models of their own (clients with fixed model names look for theirs), each with `root` naming
the model it is an alias of, as vLLM lists its served names."""

from __future__ import annotations

import asyncio

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway import errors
from gateway.completion_bodies import ModelCard, ModelList
from gateway.services import Services
from shared.heartbeat import Heartbeat
from shared.live_workers import live_workers


async def list_models(request: Request) -> JSONResponse:
    return JSONResponse(model_list(await _live_workers(request)).model_dump(mode="json"))


async def retrieve_model(request: Request) -> JSONResponse:
    model = request.path_params["model"]  # ids may hold slashes ("org/name"): a path parameter
    cards = {card.id: card for card in model_list(await _live_workers(request)).data}
    if model not in cards:
        raise errors.model_not_found(model)
    return JSONResponse(cards[model].model_dump(mode="json"))


async def _live_workers(request: Request) -> list[Heartbeat]:
    svc: Services = request.state.services
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            return await live_workers(svc.redis)
    except (RedisError, OSError, TimeoutError) as exc:
        raise errors.redis_unavailable(exc) from exc


def model_list(workers: list[Heartbeat]) -> ModelList:
    by_model: dict[str, list[Heartbeat]] = {}
    for beat in workers:
        by_model.setdefault(beat.model, []).append(beat)
    names = {(model, model): beats for model, beats in by_model.items()}
    for model, beats in by_model.items():
        for beat in beats:
            for alias in beat.aliases:
                if alias not in by_model:  # a model's own name is never shadowed by an alias
                    names.setdefault((alias, model), []).append(beat)
    cards = [_card(name, model, beats) for (name, model), beats in sorted(names.items())]
    return ModelList(object="list", data=cards)


def _card(name: str, model: str, beats: list[Heartbeat]) -> ModelCard:
    contexts = [beat.max_context for beat in beats if beat.max_context]
    card = ModelCard(
        id=name,
        object="model",
        created=int(min(beat.started_at for beat in beats)),
        max_model_len=min(contexts) if contexts else None,
    )
    if name != model:
        card.root = model
    return card
