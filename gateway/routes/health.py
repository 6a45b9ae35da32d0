"""GET /health: 200 only when Redis answers and at least one worker is ready; the body says why.

{"status": "ok" | "unavailable", "redis": true,
 "workers": [{"id", "model", "speculation", "ready", "lanes_total", "lanes_busy",
              "heartbeat_age_s", "max_context", "capacity": {"kv_cache_bytes", "kv_tokens",
              "kv_bytes_per_token", "state_bytes_per_lane", "state_lanes", "weight_bytes",
              "max_context_lanes"}}]}

The probes an orchestrator uses are separate, since /health is about the fleet, not this process:
restarting a gateway because no worker is ready (a pool scaled down, a model loading) would only
add an outage. GET /livez: 200 while the process answers at all (liveness). GET /readyz: 200 once
Redis answers (readiness: it can take requests; with no worker they get a prompt 503).
Both are open without an API key (a kubelet sends none) and say only ok or unavailable.
"""

from __future__ import annotations

import asyncio

from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import JSONResponse

from gateway.services import Services
from shared.heartbeat import CAPACITY_FIELDS, Heartbeat
from shared.live_workers import live_workers


async def health(request: Request) -> JSONResponse:
    svc: Services = request.state.services
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            await svc.redis.ping()
            workers = await live_workers(svc.redis)
    except (RedisError, OSError, TimeoutError):
        return JSONResponse({"status": "unavailable", "redis": False, "workers": []}, status_code=503)
    healthy = any(beat.ready for beat in workers)
    body = {
        "status": "ok" if healthy else "unavailable",
        "redis": True,
        "workers": [_row(b) for b in workers],
    }
    return JSONResponse(body, status_code=200 if healthy else 503)


def _row(beat: Heartbeat) -> dict[str, object]:
    return {
        "id": beat.worker_id,
        "model": beat.model,
        "speculation": beat.speculation,
        "ready": beat.ready,
        "lanes_total": beat.lanes_total,
        "lanes_busy": beat.lanes_busy,
        "heartbeat_age_s": round(beat.age_s(), 3),
        "max_context": beat.max_context,
        "capacity": {name: getattr(beat, name) for name in CAPACITY_FIELDS},
    }


async def livez(request: Request) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> JSONResponse:
    svc: Services = request.state.services
    try:
        async with asyncio.timeout(svc.settings.redis_timeout_s):
            await svc.redis.ping()
    except (RedisError, OSError, TimeoutError):
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})
