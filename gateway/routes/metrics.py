"""GET /metrics: refresh the fleet view from Redis, then expose the registry."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from gateway.services import Services
from shared.fleet import FleetSnapshot, read_fleet

log = logging.getLogger(__name__)


async def metrics(request: Request) -> Response:
    svc: Services = request.state.services
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            snapshot = await read_fleet(svc.redis)
    except (RedisError, OSError, TimeoutError) as exc:
        log.warning("metrics: Redis unavailable: %s", exc)
        snapshot = FleetSnapshot(redis_up=False, workers=[], queues={}, dead_letters=0, restarts={})
    svc.metrics.fleet.snapshot = snapshot
    return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)
