"""What request handlers share, built once in the app's lifespan and handed over as state."""

from __future__ import annotations

from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.admission import Admission
from gateway.hub import EventHub
from gateway.metrics import GatewayMetrics
from gateway.request_body import BodyParser
from shared.openai_schema import Limits
from shared.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class Services:
    settings: GatewaySettings
    redis: Redis  # decode_responses=True: every reply is str
    hub: EventHub
    metrics: GatewayMetrics
    limits: Limits
    admission: Admission
    bodies: BodyParser  # every route's request validation
