"""A worker's heartbeat: the hash at `worker_heartbeat(worker_id)`, plus its id in `WORKERS_SET`.

The worker rewrites the whole hash every `heartbeat_interval_s` and sets its TTL to
`heartbeat_ttl_s`, in one transaction:

    HSET arbor:worker:{id} <Heartbeat.to_fields()>; EXPIRE arbor:worker:{id} ttl; SADD arbor:workers {id}

A worker is alive while its hash exists. The counters (steps, tokens, drafts, ...) are totals
since `started_at`, so the gateway can sum them across workers into Prometheus counters.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

# A Redis hash's field names: str with decode_responses, bytes without (redis-py types them both).
_Field = TypeVar("_Field", bound=bytes | str)


CAPACITY_FIELDS = (
    "kv_cache_bytes",
    "kv_tokens",
    "kv_bytes_per_token",
    "state_bytes_per_lane",
    "state_lanes",
    "weight_bytes",
    "max_context_lanes",
)


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="ignore")  # newer workers may report more

    worker_id: str
    model: str  # the served model name clients put in "model"
    aliases: tuple[str, ...] = ()  # other names clients may use for it; a comma-separated field
    speculation: str  # mtp | tree | dflash | ngram | suffix | none
    ready: bool  # loaded and reading its stream
    lanes_total: int
    lanes_busy: int
    max_context: int = 0  # tokens; 0 when unknown
    steps: int = 0
    tokens: int = 0  # generated tokens
    drafts: int = 0  # speculative draft->verify cycles
    draft_tokens: int = 0  # tokens proposed by the drafter
    accepted_tokens: int = 0  # draft tokens the target accepted
    # The same three per draft source (mtp, ngram, ...): {source: {"drafts", "draft_tokens",
    # "accepted_tokens"}}; one JSON field of the hash
    draft_sources: dict[str, dict[str, int]] = Field(default_factory=dict)
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    # Priority classes: lanes waiting in the worker's scheduler, and lanes preempted (totals), by
    # priority. JSON objects in the hash.
    waiting_by_class: dict[int, int] = Field(default_factory=dict)
    preemptions_by_class: dict[int, int] = Field(default_factory=dict)
    # The capacity gate's figures (0: unknown; see worker/models/capacity.py)
    kv_cache_bytes: int = 0  # the cache lanes' K/V and recurrent states share
    kv_tokens: int = 0  # tokens of K/V it holds
    kv_bytes_per_token: int = 0
    state_bytes_per_lane: int = 0  # a hybrid lane's recurrent state (0: a plain model)
    state_lanes: int = 0  # lanes' states it holds
    weight_bytes: int = 0
    max_context_lanes: int = 0  # lanes of max_context tokens that fit together
    started_at: float  # unix s
    beat_at: float  # unix s

    def to_fields(self) -> dict[str, str]:
        fields = self.model_dump()
        fields["ready"] = "1" if self.ready else "0"
        fields["aliases"] = ",".join(self.aliases)
        fields["draft_sources"] = json.dumps(self.draft_sources, separators=(",", ":"))
        fields["waiting_by_class"] = json.dumps(self.waiting_by_class)
        fields["preemptions_by_class"] = json.dumps(self.preemptions_by_class)
        return {name: str(value) for name, value in fields.items()}

    @classmethod
    def from_fields(cls, fields: Mapping[_Field, bytes | str]) -> Heartbeat:
        raw: dict[str, object] = {_text(k): _text(v) for k, v in fields.items()}
        raw["aliases"] = tuple(name for name in str(raw.get("aliases", "")).split(",") if name)
        raw["draft_sources"] = json.loads(str(raw.get("draft_sources") or "{}"))  # absent from older workers
        for name in ("waiting_by_class", "preemptions_by_class"):
            raw[name] = json.loads(str(raw.get(name) or "{}"))
        return cls.model_validate(raw)

    def serves(self, model: str) -> bool:
        """Whether a request naming `model` is this worker's: its name or one of its aliases."""
        return model == self.model or model in self.aliases

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.beat_at)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
