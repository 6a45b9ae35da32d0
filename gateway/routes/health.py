"""GET /health: 200 only when Redis answers and at least one worker is ready; the body says why.

{"status": "ok" | "unavailable", "redis": true,
 "workers": [{"id", "model", "speculation", "ready", "lanes_total", "lanes_busy",
              "heartbeat_age_s", "max_context", "capacity": {"kv_cache_bytes", "kv_tokens",
              "kv_bytes_per_token", "state_bytes_per_lane", "state_lanes", "weight_bytes",
              "max_context_lanes"}}]}
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
