"""The cooperative lane scheduler: which lane steps next, and which waiting lane may start. Torch-free.

Lanes take turns, one step each, round robin. A step is a prefill chunk of at most
`max_prefill_chunk` tokens, or one decode step (draft -> verify -> commit). So a long prompt is
prefilled over several turns while the other lanes keep decoding:

    lanes A (decoding) and B (a 3-chunk prompt):   A  B1  A  B2  A  B3  A  B  A  B ...

Admission is by free lanes and by memory: a waiting lane starts once a lane is free and its KV
bytes fit next to the running lanes'. Waiting lanes start in arrival order (no overtaking, so a
large request is not starved by small ones).

Before every step the lane is checked for cancellation and for its deadline; a lane dropped for
either is released without running and reported as the turn's result. The model is behind
`LaneStepper`, so the policy tests run with a fake stepper and no torch.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

LaneKey = tuple[str, int]  # (request id, choice index)


class LaneTooLarge(ValueError):
    """A lane whose KV bytes exceed the whole memory budget: it could never start."""


@dataclass(slots=True)
class LaneRequest:
    key: LaneKey
    kv_bytes: int  # memory the lane holds while it runs
    deadline: float | None  # unix s; past it the lane is dropped before its next step
    payload: Any  # what the stepper needs to start the lane


class StepKind(enum.Enum):
    PREFILL = "prefill"
    DECODE = "decode"
    CANCELLED = "cancelled"  # dropped before stepping: the request was cancelled
    EXPIRED = "expired"  # dropped before stepping: its deadline passed
    FAILED = "failed"  # the stepper raised; the lane is released and `error` says why


@dataclass(slots=True)
class StepResult:
    key: LaneKey
    kind: StepKind
    state: Any  # the stepper's lane state (None for a lane dropped before it started)
    num_prefilled: int = 0
    token_ids: list[int] = field(default_factory=list)  # emitted by a decode step
    error: Exception | None = None  # for FAILED


class LaneStepper(Protocol):
    """The model-facing half of a lane. All calls happen on the owner thread."""

    def start(self, payload: Any) -> Any:
        """Allocate the lane (KV cache, prefix-cache lookup); returns its state."""

    def num_to_prefill(self, state: Any) -> int: ...

    def prefill(self, state: Any, max_tokens: int) -> int:
        """Prefill at most `max_tokens` tokens; returns how many were prefilled."""

    def decode(self, state: Any) -> list[int]:
        """One draft -> verify -> commit cycle; returns the emitted token ids."""

    def release(self, state: Any) -> None:
        """The lane is done; free what it holds."""


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    max_lanes: int
    max_kv_bytes: int
    max_prefill_chunk: int = 256


@dataclass(slots=True)
class _Lane:
    request: LaneRequest
    state: Any


class Scheduler:
    def __init__(
        self,
        stepper: LaneStepper,
        config: SchedulerConfig,
        is_cancelled: Callable[[LaneKey], bool] = lambda key: False,
        clock: Callable[[], float] = time.time,
    ):
        assert config.max_lanes >= 1 and config.max_prefill_chunk >= 1, config
        self.stepper = stepper
        self.config = config
        self.is_cancelled = is_cancelled
        self.clock = clock
        self._waiting: deque[LaneRequest] = deque()
        self._running: deque[_Lane] = deque()
        self._kv_bytes = 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_free_lanes(self) -> int:
        return self.config.max_lanes - len(self._running)

    @property
    def kv_bytes(self) -> int:
        return self._kv_bytes

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    def submit(self, request: LaneRequest) -> None:
        if request.kv_bytes > self.config.max_kv_bytes:
            raise LaneTooLarge(
                f"lane {request.key} needs kv_bytes={request.kv_bytes}, more than the "
                f"worker's max_kv_bytes={self.config.max_kv_bytes}"
            )
        self._waiting.append(request)

    def step(self) -> StepResult | None:
        """One turn: a dropped waiting lane, or one step of the next running lane; None when idle."""
        dropped = self._drop_waiting() or self._admit()
        if dropped is not None:
            return dropped
        if not self._running:
            return None
        lane = self._running.popleft()
        reason = self._drop_reason(lane.request)
        if reason is not None:
            self._release(lane)
            return StepResult(lane.request.key, reason, lane.state)
        try:
            result = self._run(lane)
        except Exception as error:  # one broken lane must not take the worker's other lanes down
            self._release(lane)
            return StepResult(lane.request.key, StepKind.FAILED, lane.state, error=error)
        self._running.append(lane)
        return result

    def retire(self, key: LaneKey) -> None:
        """The caller finished the lane (end of sequence, stop string, error): free it."""
        for lane in self._running:
            if lane.request.key == key:
                self._running.remove(lane)
                self._release(lane)
                return
        self._waiting = deque(request for request in self._waiting if request.key != key)

    def _run(self, lane: _Lane) -> StepResult:
        stepper, key = self.stepper, lane.request.key
        remaining = stepper.num_to_prefill(lane.state)
        if remaining > 0:
            num = stepper.prefill(lane.state, min(remaining, self.config.max_prefill_chunk))
            return StepResult(key, StepKind.PREFILL, lane.state, num_prefilled=num)
        return StepResult(key, StepKind.DECODE, lane.state, token_ids=stepper.decode(lane.state))

    def _drop_reason(self, request: LaneRequest) -> StepKind | None:
        if self.is_cancelled(request.key):
            return StepKind.CANCELLED
        if request.deadline is not None and self.clock() > request.deadline:
            return StepKind.EXPIRED
        return None

    def _drop_waiting(self) -> StepResult | None:
        for request in self._waiting:
            reason = self._drop_reason(request)
            if reason is not None:
                self._waiting.remove(request)
                return StepResult(request.key, reason, None)
        return None

    def _admit(self) -> StepResult | None:
        """Start waiting lanes while lanes and memory allow; a lane that fails to start is the turn's result."""
        while self._waiting and self.num_free_lanes > 0:
            request = self._waiting[0]
            if self._kv_bytes + request.kv_bytes > self.config.max_kv_bytes:
                return None
            self._waiting.popleft()
            try:
                state = self.stepper.start(request.payload)
            except Exception as error:  # e.g. out of memory: report it against this lane only
                return StepResult(request.key, StepKind.FAILED, None, error=error)
            self._kv_bytes += request.kv_bytes
            self._running.append(_Lane(request, state))
        return None

    def _release(self, lane: _Lane) -> None:
        self._kv_bytes -= lane.request.kv_bytes
        self.stepper.release(lane.state)
