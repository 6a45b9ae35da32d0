"""The batch scheduler: which lanes run in the next step, and with how many rows. Torch-free.

Every step is one target forward over the rows of several lanes, at most `max_batch_tokens`
rows in all (a token budget, as vLLM's and SGLang's schedulers have):

1. every running lane that is decoding gets its decode rows (root + draft nodes), in turn;
2. running lanes still prefilling get chunks of their prompt, in arrival order, from what is left;
3. waiting lanes start, best priority class first (lower runs sooner, vLLM's meaning) and in
   arrival order within a class, while lanes, memory and budget allow; each brings its first
   prompt chunk into the same step (time to first token is one step, not a queue of turns).

So a long prompt is prefilled over several steps while the other lanes keep decoding in each:

    budget 8, lane A decoding, lane B with an 11-token prompt:
    step 1: A(1) B(7)   step 2: A(1) B(4)   step 3: A(1) B(1)   step 4: A(1) B(1) ...

Memory is the stepper's pool of KV blocks. A lane is admitted when the blocks its tokens so far
need are free; a running lane takes blocks as it grows. When a step's lanes need more blocks
than are free, the lowest-class lane not in the step yet is preempted (the most recently
started among equals): its blocks go back, and it waits at the head of its class to be
prefilled again (prompt and output so far: its output continues where it stopped, nothing
repeated or lost). Before each step, a waiting lane of a better class than a running one that
cannot start (every lane taken, or too few free blocks) has running lanes of the lowest class
preempted for it, so it starts in that step:

    lanes 2, running A(p10) B(p10), waiting C(p0)  ->  B preempted, step runs A and C;
    waiting: B (at the head of class 10), resumed when a lane frees

A hybrid model's lanes also hold
a recurrent-state slot each while they run: `max_lanes` is at most the slots (the worker sets
it), so counting lanes counts slots. A lane whose memory is fixed when it starts instead
(`kv_bytes`: a buffer of its own, outside any pool) counts against `max_kv_bytes`.

Cancellation and deadlines are checked before every step; a lane dropped for either is
released without running. A lane whose step raises fails alone. The model is behind
`LaneStepper`, so the policy tests run with a fake stepper and no torch.
"""

from __future__ import annotations

import enum
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

LaneKey = tuple[str, int]  # (request id, choice index)


class LaneTooLarge(ValueError):
    """A lane that could never run: it needs more memory than the worker has in all."""


@dataclass(slots=True)
class LaneRequest:
    key: LaneKey
    kv_bytes: int  # memory fixed when the lane starts (0 for lanes in the block pool)
    deadline: float | None  # unix s; past it the lane is dropped before its next step
    payload: Any  # what the stepper needs to start the lane
    num_blocks: int = 0  # pool blocks its tokens so far need: admitted when they are free
    max_blocks: int = 0  # pool blocks it needs at its longest (refused if the pool has fewer)
    priority: int = 0  # its class: lower starts sooner and is preempted later


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


@dataclass(slots=True)
class LaneWorkItem:
    state: Any
    num_prefill: int  # > 0: a prefill chunk of this many tokens; 0: a decode step


class LaneStepper(Protocol):
    """The model-facing half of the lanes. All calls happen on the owner thread."""

    def start(self, payload: Any) -> Any:
        """Set the lane up (its cache, a prefix-cache lookup); returns its state."""

    def num_to_prefill(self, state: Any) -> int: ...

    def decode_rows(self, state: Any) -> int:
        """Rows the lane's next decode step may take (root + draft nodes)."""

    def free_blocks(self) -> int: ...

    def blocks_needed(self, state: Any, num_rows: int) -> int:
        """Blocks the lane must take before a step that adds `num_rows` rows."""

    def step(self, items: list[LaneWorkItem]) -> list[list[int] | Exception]:
        """One forward over every item; per item the tokens a decode step emitted ([] for a
        prefill chunk) or the exception that ended that lane (the others are unaffected)."""

    def preempt(self, state: Any) -> None:
        """Give the lane's blocks back; it is prefilled again (prompt + output) when it resumes."""

    def resume(self, state: Any) -> None:
        """A preempted lane is admitted again (before its first prefill chunk): a prefix-cache lookup."""

    def release(self, state: Any) -> None:
        """The lane is done; free what it holds."""


@dataclass(slots=True, frozen=True)
class SchedulerConfig:
    max_lanes: int
    max_kv_bytes: int  # for lanes whose memory is fixed at start (`LaneRequest.kv_bytes`)
    max_batch_tokens: int = 256  # rows of one step
    num_blocks: int | None = None  # the pool's size (None: lanes hold no pool blocks)


@dataclass(slots=True)
class _Lane:
    request: LaneRequest
    arrival: int  # submission order: the tie-break within a class
    state: Any = None  # None until started (a preempted lane keeps its state)

    @property
    def priority(self) -> int:
        return self.request.priority


class Scheduler:
    def __init__(
        self,
        stepper: LaneStepper,
        config: SchedulerConfig,
        is_cancelled: Callable[[LaneKey], bool] = lambda key: False,
        clock: Callable[[], float] = time.time,
    ):
        assert config.max_lanes >= 1 and config.max_batch_tokens >= 1, config
        self.stepper = stepper
        self.config = config
        self.is_cancelled = is_cancelled
        self.clock = clock
        self._waiting: deque[_Lane] = deque()
        self._running: deque[_Lane] = deque()
        self._kv_bytes = 0
        self.num_preemptions = 0
        self.preemptions_by_class: dict[int, int] = {}  # priority -> lanes of that class preempted
        self._decode_turn = 0
        self._arrivals = 0

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_bytes(self) -> int:
        return self._kv_bytes

    @property
    def idle(self) -> bool:
        return not self._running and not self._waiting

    @property
    def worst_running_priority(self) -> int | None:
        """The lowest class among running lanes (the largest number), None with none running."""
        return max((lane.priority for lane in self._running), default=None)

    def waiting_by_class(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for lane in self._waiting:
            counts[lane.priority] = counts.get(lane.priority, 0) + 1
        return counts

    def submit(self, request: LaneRequest) -> None:
        if request.kv_bytes > self.config.max_kv_bytes:
            raise LaneTooLarge(
                f"lane {request.key} needs kv_bytes={request.kv_bytes}, more than the "
                f"worker's max_kv_bytes={self.config.max_kv_bytes}"
            )
        num_blocks = self.config.num_blocks
        if num_blocks is not None and request.max_blocks > num_blocks:
            raise LaneTooLarge(
                f"lane {request.key} needs {request.max_blocks} KV blocks at its longest, more than the "
                f"worker's {num_blocks} (ARBOR_KV_CACHE_BYTES)"
            )
        self._arrivals += 1
        self._wait(_Lane(request, self._arrivals))

    def step(self) -> list[StepResult]:
        """One step: the lanes dropped before it, then one result per lane that ran (or failed)."""
        results = self._drop(self._waiting) + self._drop(self._running)
        self._preempt_for_better_class()
        plan = _Plan(self.config.max_batch_tokens, self.stepper.free_blocks())
        self._plan_running(plan)
        results += self._admit(plan)
        if not plan.items:
            return results
        outcomes = self.stepper.step([LaneWorkItem(lane.state, rows) for lane, rows in plan.items])
        for (lane, num_prefill), outcome in zip(plan.items, outcomes, strict=True):
            results.append(self._result(lane, num_prefill, outcome))
        planned_decodes = sum(1 for _, num_prefill in plan.items if num_prefill == 0)
        if planned_decodes < plan.num_decoding:
            self._decode_turn += planned_decodes  # the budget was short: next step starts with those left out
        return results

    def retire(self, key: LaneKey) -> None:
        """The caller finished the lane (end of sequence, stop string, error): free it."""
        for queue in (self._running, self._waiting):
            for lane in queue:
                if lane.request.key == key:
                    queue.remove(lane)
                    self._release(lane)
                    return

    # -- planning ---------------------------------------------------------------------------

    def _plan_running(self, plan: _Plan) -> None:
        stepper = self.stepper
        decoding = [lane for lane in self._running if stepper.num_to_prefill(lane.state) == 0]
        prefilling = [lane for lane in self._running if stepper.num_to_prefill(lane.state) > 0]
        plan.num_decoding = len(decoding)
        turn = self._decode_turn % len(decoding) if decoding else 0
        for lane in decoding[turn:] + decoding[:turn]:
            if id(lane) in plan.preempted:
                continue
            self._add(plan, lane, stepper.decode_rows(lane.state), num_prefill=0)
        for lane in prefilling:
            if plan.budget == 0:
                break
            if id(lane) in plan.preempted:
                continue
            rows = min(stepper.num_to_prefill(lane.state), plan.budget)
            self._add(plan, lane, rows, num_prefill=rows)

    def _add(self, plan: _Plan, lane: _Lane, rows: int, num_prefill: int) -> bool:
        """Put the lane in the step if the budget and the blocks allow (preempting for blocks)."""
        if rows > plan.budget and plan.items:
            return False
        needed = self.stepper.blocks_needed(lane.state, rows)
        while needed > plan.free_blocks:
            victim = self._victim(plan)
            if victim is None:
                return False
            self._preempt(plan, victim)
            if victim is lane:
                return False
        plan.free_blocks -= needed
        plan.budget = max(plan.budget - rows, 0)
        plan.items.append((lane, num_prefill))
        plan.lanes.add(id(lane))
        return True

    def _victim(self, plan: _Plan) -> _Lane | None:
        """The lowest-class lane not in the step, the most recently started among equals (the
        lane itself if it is that one)."""
        return self._lowest_class(lane for lane in self._running if id(lane) not in plan.lanes)

    @staticmethod
    def _lowest_class(lanes: Iterable[_Lane]) -> _Lane | None:
        victim = None
        for lane in lanes:  # in start order: a later one of the same class wins
            if victim is None or lane.priority >= victim.priority:
                victim = lane
        return victim

    def _preempt(self, plan: _Plan, lane: _Lane) -> None:
        before = self.stepper.free_blocks()
        self._preempt_lane(lane)
        plan.free_blocks += self.stepper.free_blocks() - before
        plan.preempted.add(id(lane))

    def _preempt_lane(self, lane: _Lane) -> None:
        self.stepper.preempt(lane.state)
        self._running.remove(lane)
        self._wait(lane, first_in_class=True)
        self.num_preemptions += 1
        self.preemptions_by_class[lane.priority] = self.preemptions_by_class.get(lane.priority, 0) + 1

    def _preempt_for_better_class(self) -> None:
        """Running lanes of the lowest class make way for a waiting lane of a better class that
        could not start otherwise (every lane taken, or too few free blocks)."""
        while self._waiting:
            head = self._waiting[0]
            victim = self._lowest_class(self._running)
            if victim is None or victim.priority <= head.priority or not self._blocked(head):
                return
            self._preempt_lane(victim)

    def _blocked(self, lane: _Lane) -> bool:
        """Every lane taken, or the blocks free once the running lanes took their next step's
        too few for the lane's tokens."""
        if len(self._running) >= self.config.max_lanes:
            return True
        stepper = self.stepper
        growth = sum(stepper.blocks_needed(other.state, self._next_rows(other)) for other in self._running)
        return lane.request.num_blocks + growth > stepper.free_blocks()

    def _next_rows(self, lane: _Lane) -> int:
        remaining = self.stepper.num_to_prefill(lane.state)
        return min(remaining, self.config.max_batch_tokens) if remaining else self.stepper.decode_rows(lane.state)

    def _wait(self, lane: _Lane, first_in_class: bool = False) -> None:
        """Into the waiting queue, ordered by class: a new lane after its class, a preempted one
        at its head (it started first, and resumes first)."""
        # a preempted lane goes before its class's first lane, a new one after its class's last
        bound = lane.priority - 1 if first_in_class else lane.priority
        index = next((i for i, other in enumerate(self._waiting) if other.priority > bound), len(self._waiting))
        self._waiting.insert(index, lane)

    def _admit(self, plan: _Plan) -> list[StepResult]:
        """Start (or resume) waiting lanes, in arrival order, while lanes, memory and budget allow."""
        results: list[StepResult] = []
        while self._waiting and len(self._running) < self.config.max_lanes and plan.budget > 0:
            lane = self._waiting[0]
            request = lane.request
            if id(lane) in plan.preempted:
                break  # memory ran out in this step: it resumes in a later one
            if request.num_blocks > plan.free_blocks or self._kv_bytes + request.kv_bytes > self.config.max_kv_bytes:
                break
            self._waiting.popleft()
            if lane.state is None:
                try:
                    lane.state = self.stepper.start(request.payload)
                except Exception as error:  # e.g. out of memory: report it against this lane only
                    results.append(StepResult(request.key, StepKind.FAILED, None, error=error))
                    continue
                self._kv_bytes += request.kv_bytes
            else:
                self.stepper.resume(lane.state)
            self._running.append(lane)
            remaining = self.stepper.num_to_prefill(lane.state)
            if remaining > 0:
                self._add(plan, lane, min(remaining, plan.budget), num_prefill=min(remaining, plan.budget))
            else:
                plan.num_decoding += 1
                self._add(plan, lane, self.stepper.decode_rows(lane.state), num_prefill=0)
        return results

    # -- results ----------------------------------------------------------------------------

    def _result(self, lane: _Lane, num_prefill: int, outcome: list[int] | Exception) -> StepResult:
        key = lane.request.key
        if isinstance(outcome, Exception):
            self._running.remove(lane)
            self._release(lane)
            return StepResult(key, StepKind.FAILED, lane.state, error=outcome)
        if num_prefill > 0:
            return StepResult(key, StepKind.PREFILL, lane.state, num_prefilled=num_prefill)
        return StepResult(key, StepKind.DECODE, lane.state, token_ids=outcome)

    def _drop(self, queue: deque[_Lane]) -> list[StepResult]:
        results = []
        for lane in list(queue):
            reason = self._drop_reason(lane.request)
            if reason is not None:
                queue.remove(lane)
                self._release(lane)
                results.append(StepResult(lane.request.key, reason, lane.state))
        return results

    def _drop_reason(self, request: LaneRequest) -> StepKind | None:
        if self.is_cancelled(request.key):
            return StepKind.CANCELLED
        if request.deadline is not None and self.clock() > request.deadline:
            return StepKind.EXPIRED
        return None

    def _release(self, lane: _Lane) -> None:
        if lane.state is None:
            return
        self._kv_bytes -= lane.request.kv_bytes
        self.stepper.release(lane.state)


@dataclass(slots=True)
class _Plan:
    budget: int  # rows left in the step
    free_blocks: int  # pool blocks free once the planned lanes took theirs
    items: list[tuple[_Lane, int]] = field(default_factory=list)  # (lane, num_prefill)
    lanes: set[int] = field(default_factory=set)  # id() of each planned lane
    preempted: set[int] = field(default_factory=set)  # id() of each lane preempted while planning
    num_decoding: int = 0  # running lanes that were decoding when the step was planned
