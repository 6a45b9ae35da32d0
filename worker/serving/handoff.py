"""What the owner thread and the Redis side hand each other: a job to run (`JobSpec`, parsed by
worker/redis_side/jobs.py), the events and acknowledgements the owner queues for publishing
(`Publication`, `JobDone`), and the counters the heartbeat reads (`WorkerCounters`). Defined here,
below both rooms, so the serving loop never imports the Redis side."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shared.protocol import DeltaEvent, ErrorEvent, FinalEvent, JobState
from shared.sampling import SamplingParams
from worker.engine.stats import SourceCounts
from worker.models.capacity import Capacity
from worker.serving.lane_output import OutputOptions
from worker.serving.step_delta import StepDelta

Event = DeltaEvent | FinalEvent | ErrorEvent


@dataclass(slots=True)
class JobSpec:
    request_id: str
    entry_id: str
    attempt: int
    kind: str
    created: float
    deadline: float
    prompt_ids: list[int]
    params: SamplingParams
    n: int
    output: OutputOptions
    resume: JobState  # emitted tokens, finished choices and next seq (all empty for a first attempt)
    picked_at: float = field(default_factory=time.time)
    priority: int = 0  # the class its lanes run in (lower runs sooner)

    def resumed_ids(self, choice: int) -> list[int]:
        emitted = self.resume.emitted_token_ids
        return list(emitted[choice]) if choice < len(emitted) else []


@dataclass(slots=True, frozen=True)
class JobRef:
    """Where a job lives, and which delivery of it this worker holds."""

    request_id: str
    stream: str
    entry_id: str
    attempt: int


@dataclass(slots=True)
class Publication:
    """One event of a job (written with the job state it leaves: see `JobState`)."""

    ref: JobRef
    event: Event | StepDelta  # a delta stays a StepDelta until its batch is encoded
    # A delta up to and including the job's first visible output: never held back (TTFT). Finals,
    # errors and acks never are either; later deltas may wait for the stream and publish intervals.
    first_output: bool = False


@dataclass(slots=True)
class JobDone:
    """Every choice of a job has ended (or the request failed): acknowledge the entry, drop the state."""

    ref: JobRef


BatchItem = Publication | JobDone


@dataclass(slots=True)
class WorkerCounters:
    """Totals since start-up. Written by the owner thread only; read (racily, harmlessly) by beats."""

    steps: int = 0
    tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    # Served on the worker's own /metrics only (see worker.redis_side.metrics), not in the heartbeat:
    accepted_by_position: list[int] = field(default_factory=list)  # [d]: drafts whose depth d+1 was accepted
    prefix_cache_bytes: int = 0
    redeliveries: int = 0  # jobs this worker reclaimed from a dead one
    preemptions: int = 0  # lanes that gave their KV blocks back to let others run, to resume later
    step_lanes: int = 0  # lanes summed over every step (÷ steps: the mean batch)
    step_rows: int = 0  # rows summed over every step
    kv_blocks_used: int = 0  # KV pool blocks held now (set after every step)
    kv_blocks_total: int = 0
    draft_length: int = 0  # adaptive speculation's choice for the last decode step
    lanes_speculating: int = 0  # lanes of the last decode step that drafted
    by_source: dict[str, SourceCounts] = field(default_factory=dict)  # drafts per draft source (DraftTree.source)
    capacity: Capacity | None = None  # what fits in the cache (the capacity gate), set once at start-up
