"""The model-facing half of a lane: `LaneStepper` over the model runner and the paired prefill cache.

A lane starts by looking up the longest cached block prefix of its tokens; on a hit the target's
KV and the drafter's snapshot for that prefix are attached together and prefill goes on from
there (not for a lane that wants its prompt's logprobs: a cached prefix has no logits, so it
prefills its prompt whole; it is still stored for others). When a lane's prefill completes, its
longest whole-block prefix is stored (unless already cached), so the next request with the same
system prompt skips it. Runs on the owner thread.

Lanes in the KV pool share a cached prefix's K/V instead of copying it (as vLLM's automatic
prefix caching does): an entry's target half is the ids of the pool blocks holding its tokens,
and the entry is one more holder of each (`BlockAllocator.share(..., by_cache=True)`); a hit
starts the lane's block table with those blocks, held once more, and its own tokens go into
new blocks after them (kv_pool.PagedKVCache: a lane never writes into a shared block). An
entry's bytes are its blocks' bytes (overlapping entries counted for each) plus the drafter's
snapshot, under ARBOR_PREFILL_CACHE_BYTES; leaving the cache (evicted, superseded, cleared) an
entry drops its holds. Blocks only the cache holds count as free for admission
(`free_blocks`): an allocation short of free blocks evicts entries, least recently used first,
until enough are (`_reclaim`), before the scheduler would have to preempt a lane. A hit that
takes such blocks away from the cache adds them to the lane's `blocks_needed` in the plan that
admits it, so the plan does not count them twice. Lanes without a pool copy K/V in and out of
the entries instead. A hybrid model's entries also hold copies of its recurrent state at each of
their block boundaries, kept while its prefill passed them (`snapshot_every`), so a hit (or a
preempted lane resuming: its own prompt was stored) starts from the longest block prefix with a
state (worker/models/hybrid/hybrid_pool.py).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import torch

from shared.sampling import SamplingParams
from worker.engine.drafter_protocol import reuses_prefixes, supports_prefix_reuse
from worker.engine.logits_processing import TokenLogprobs, logprobs_of
from worker.engine.runner import GRAMMAR_SOURCE, MAX_FORCED_DRAFT, LaneWork, ModelRunner
from worker.engine.sequence import Sequence
from worker.engine.stats import SpecStats, add_to_source
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_cache import HybridCache, HybridPrefix
from worker.models.hybrid.hybrid_pool import HybridBlocks, PagedHybridCache
from worker.models.kv_pool import KVPool
from worker.serving.handoff import WorkerCounters
from worker.serving.prefix_cache import PrefixCache, PrefixEntry
from worker.serving.scheduler import LaneWorkItem
from worker.serving.step_cost_probe import COST_LANE_COUNTS, COST_REPEATS, measure_step_costs
from worker.serving_model import verify_rows
from worker.speculation.acceptance import DEFAULT_ACCEPTANCE, WORKER_DECAY, DepthAcceptance, worker_priors
from worker.speculation.adaptive import LaneOutlook, choose_draft_length
from worker.speculation.step_costs import OnlineStepCosts, StepCosts

log = logging.getLogger(__name__)
NO_POOL_BLOCKS = 1 << 62  # free blocks, as the scheduler sees them, where lanes hold none
SNAPSHOT_SHARE = 0.5  # of the prefill cache's budget, for one lane's recurrent-state snapshots


@dataclass(slots=True)
class LaneStart:
    """What a lane needs to start (the scheduler's payload)."""

    sequence_id: str
    prompt_ids: list[int]
    params: SamplingParams
    resumed_ids: list[int] = field(default_factory=list)  # tokens a dead worker already emitted
    num_logprobs: int | None = None
    num_prompt_logprobs: int | None = None  # the prompt's logprobs, with this many top tokens


@dataclass(slots=True)
class LaneState:
    sequence: Sequence
    num_logprobs: int | None
    prefix_tokens: int = 0  # tokens reused from the prefix cache
    stored: bool = False  # its prefix went to the cache (or was already there)
    claimed_blocks: int = 0  # blocks its prefix hit took from those only the cache held, not yet planned
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # of the last decode step's tokens
    acceptance: DepthAcceptance = field(default_factory=DepthAcceptance)  # its drafter's, recent steps weighed most
    tree_depths: list[int] = field(default_factory=list)  # its drafter's last tree's node depths ([]: chains)
    prompt_logprobs_sent: bool = False  # the owner published them

    @property
    def finished(self) -> bool:
        return self.sequence.finished

    @property
    def finish_reason(self) -> Literal["stop", "length"] | None:
        return self.sequence.finish_reason

    @property
    def output_ids(self) -> list[int]:
        return self.sequence.output_ids

    @property
    def stats(self) -> SpecStats:
        return self.sequence.stats


class ModelStepper:
    def __init__(
        self,
        runner: ModelRunner,
        prefix_cache: PrefixCache | None = None,
        counters: WorkerCounters | None = None,
        pool: KVPool | None = None,
    ):
        if prefix_cache is not None and not supports_prefix_reuse(runner.drafter):
            log.warning(
                "drafter %s cannot export its context: the prefill cache is off",
                getattr(runner.drafter, "name", runner.drafter),
            )
            prefix_cache = None
        self.runner = runner
        self.pool = pool  # where the lanes' K/V live (None: a buffer per lane, sized at its start)
        self._decode_rows = verify_rows(runner.drafter)  # a decode step's rows: root + the most draft nodes
        # Adaptive speculation (worker.speculation.adaptive): step costs (the start-up table,
        # corrected by the steps run) and the drafter's acceptance per depth over the worker;
        # without costs every lane drafts all its drafter proposes.
        self._online_costs: OnlineStepCosts | None = None
        self.worker_acceptance = DepthAcceptance(decay=WORKER_DECAY)
        self.prefix_cache = prefix_cache
        if prefix_cache is not None and pool is not None:  # entries hold pool blocks (module docstring)
            assert prefix_cache.block_tokens % pool.block_tokens == 0, (prefix_cache.block_tokens, pool.block_tokens)
            prefix_cache.on_drop = self._drop_entry
            pool.allocator.reclaim = self._reclaim
        self.counters = counters or WorkerCounters()
        self._logprob_lanes: dict[str, LaneState] = {}  # the observer is installed only while one exists

    def kv_bytes(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """Bytes fixed when such a lane starts: 0 in the pool (its blocks are counted instead),
        else the KV cache (and recurrent state) `runner.start` allocates."""
        if self.pool is not None:
            return 0
        config = self.runner.decoder.config
        capacity = self._capacity(num_prompt_tokens, max_tokens)
        if isinstance(self.runner.decoder, HybridDecoder):  # K/V for its attention layers only, + recurrent state
            return self.runner.decoder.cache_bytes(capacity)
        element = torch.empty((), dtype=self.runner.decoder.dtype).element_size()
        return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * capacity * element

    def blocks_for(self, num_tokens: int) -> int:
        """Pool blocks `num_tokens` tokens take (0 without a pool)."""
        pool = self.pool
        return 0 if pool is None else pool.blocks_for(num_tokens)

    def blocks_to_admit(self, num_tokens: int) -> int:
        """Blocks a lane of `num_tokens` tokens so far (prompt + resumed output) needs to start:
        its prefill and a first decode step."""
        return self.blocks_for(num_tokens + self.runner.max_draft_nodes + 1)

    def max_blocks(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return self.blocks_for(self._capacity(num_prompt_tokens, max_tokens))

    @property
    def num_blocks(self) -> int | None:
        pool = self.pool
        return None if pool is None else pool.num_blocks

    def _capacity(self, num_prompt_tokens: int, max_tokens: int) -> int:
        return num_prompt_tokens + max_tokens + self.runner.max_draft_nodes + 1

    def start(self, payload: LaneStart) -> LaneState:
        sequence = self.runner.start(
            payload.sequence_id,
            payload.prompt_ids,
            payload.params,
            payload.resumed_ids,
            self.pool,
            payload.num_prompt_logprobs,
        )
        state = LaneState(sequence, payload.num_logprobs)
        if self.prefix_cache is not None and isinstance(sequence.cache, HybridCache | PagedHybridCache):
            cache = sequence.cache
            cache.snapshot_every = self.prefix_cache.block_tokens  # states at its block boundaries
            # a real hybrid's state is megabytes a block: snapshots get a share of the cache's budget
            decoder = self.runner.decoder
            assert isinstance(decoder, HybridDecoder), type(decoder)
            state_bytes = decoder.state_bytes()
            cache.max_snapshots = max(1, int(self.prefix_cache.max_bytes * SNAPSHOT_SHARE) // state_bytes)
        if not sequence.finished:
            self._reuse_prefix(state)
        if payload.num_logprobs is not None:
            self._logprob_lanes[payload.sequence_id] = state
            self.runner.logits_observer = self._observe_logits
        return state

    def num_to_prefill(self, state: LaneState) -> int:
        return 0 if state.finished else state.sequence.num_to_prefill

    @property
    def step_costs(self) -> OnlineStepCosts | None:
        return self._online_costs

    @step_costs.setter
    def step_costs(self, measured: StepCosts | None) -> None:
        """The start-up table: the prior that the steps this worker runs correct."""
        self._online_costs = None if measured is None else OnlineStepCosts(measured)

    def decode_rows(self, state: LaneState) -> int:
        """Rows its decode step may take: a structured output's may verify what its grammar forces."""
        if state.sequence.constraint is not None:
            return max(self._decode_rows, 1 + min(MAX_FORCED_DRAFT, self.runner.max_draft_nodes))
        return self._decode_rows

    def free_blocks(self) -> int:
        """Blocks a step may take: the free ones and those only the prefill cache holds (`_reclaim`)."""
        pool = self.pool
        return NO_POOL_BLOCKS if pool is None else pool.allocator.num_free + pool.allocator.num_reclaimable

    def blocks_needed(self, state: LaneState, num_rows: int) -> int:
        """New blocks for the lane's next `num_rows` rows, and the cache's blocks its prefix hit took
        since `free_blocks` counted them as free (until its first step)."""
        cache = state.sequence.cache
        return cache.blocks_needed(min(cache.length + num_rows, cache.max_tokens)) + state.claimed_blocks

    def step(self, items: list[LaneWorkItem]) -> list[list[int] | Exception]:
        """One forward over the items' lanes (a finished lane's item emits nothing and runs nothing)."""
        outcomes: list[list[int] | Exception] = [[] for _ in items]
        works: list[tuple[int, LaneState, LaneWork]] = []
        for index, item in enumerate(items):
            state = item.state
            if not state.finished:
                state.logprobs = []
                works.append((index, state, LaneWork(state.sequence, item.num_prefill)))
        before = [_spec_counts(state) for _, state, _ in works]
        self._limit_drafts([state for _, state, work in works if not work.is_prefill])
        started = time.perf_counter()
        self.runner.step([work for _, _, work in works])
        self._learn([(state, work) for _, state, work in works], time.perf_counter() - started)
        counters = self.counters
        counters.steps += 1
        counters.step_lanes += len(works)
        counters.step_rows += sum(work.num_rows for _, _, work in works)
        pool = self.pool
        if pool is not None:
            counters.kv_blocks_used, counters.kv_blocks_total = pool.allocator.num_used, pool.num_blocks
        for (index, state, work), counts in zip(works, before, strict=True):
            if work.error is not None:
                outcomes[index] = work.error
            elif work.is_prefill:
                self._after_prefill(state)
            else:
                self._count_decode(state, counts, work.emitted)
                outcomes[index] = work.emitted
        return outcomes

    def _limit_drafts(self, decoding: list[LaneState]) -> None:
        """Each decoding lane's draft length for this step, from the costs at this load and what
        each lane's drafts promise (worker.speculation.adaptive); now and then a length whose
        cost has gone stale instead (OnlineStepCosts.explore)."""
        costs, counters = self._online_costs, self.counters
        if costs is None or not decoding:
            return
        max_depth = max(costs.draft_lengths)
        # A lane's rates start from the worker's, but never below the default: how well drafts
        # do depends on its own text (an n-gram drafter's matches, a head's topic), so a young
        # lane drafts for a few steps and shows its own rates rather than inheriting a worker's
        # figure it would never revise (a lane that does not draft measures nothing).
        priors = [max(rate, DEFAULT_ACCEPTANCE) for rate in worker_priors(self.worker_acceptance, max_depth)]
        outlooks = [LaneOutlook(state.acceptance.rates(max_depth, priors), state.tree_depths) for state in decoding]
        draft_length = choose_draft_length(costs, outlooks)
        explored = costs.explore(draft_length)
        draft_length = draft_length if explored is None else explored
        drafter = self.runner.drafter
        if drafter is not None and hasattr(drafter, "row_price"):  # it sizes each lane's draft by a row's cost now
            drafter.row_price = costs.row_price(len(decoding))
        for state in decoding:
            state.sequence.draft_limit = draft_length
        counters.draft_length = draft_length
        counters.lanes_speculating = len(decoding) if draft_length else 0

    def _learn(self, works: list[tuple[LaneState, LaneWork]], seconds: float) -> None:
        """What the step says about drafts and costs: each lane's acceptance per depth (its
        drafter's drafts only: a grammar's forced tokens are always accepted, and say nothing of
        the drafter), and the cost of a step of only decoding lanes."""
        for state, work in works:
            if work.error is None and not work.is_prefill and work.source not in ("", GRAMMAR_SOURCE):
                state.acceptance.record(work.num_accepted, work.offered_next)
                self.worker_acceptance.record(work.num_accepted, work.offered_next)
                state.tree_depths = [] if work.tree.is_chain else list(work.tree.depths)
        costs = self._online_costs
        if costs is not None and works and all(not work.is_prefill and work.error is None for _, work in works):
            costs.record(len(works), sum(work.num_rows for _, work in works), seconds)

    @property
    def max_draft(self) -> int:
        """Draft tokens a lane's decode step verifies at most."""
        return self._decode_rows - 1

    def measure_step_costs(
        self, lane_counts: tuple[int, ...] = COST_LANE_COUNTS, repeats: int = COST_REPEATS
    ) -> StepCosts | None:
        """What a decode step costs here with n lanes drafting k tokens each (drafting included),
        for adaptive speculation; None where there is nothing to adapt (no drafter, no pool)."""
        pool = self.pool
        if pool is None or self.runner.drafter is None:
            return None
        return measure_step_costs(self.runner, pool, self.max_draft, lane_counts, repeats)

    def prefill(self, state: LaneState, max_tokens: int) -> int:
        """One prefill chunk of this lane alone (as a step of one)."""
        num = min(max_tokens, state.sequence.num_to_prefill)
        outcome = self.step([LaneWorkItem(state, num)])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return num

    def decode(self, state: LaneState) -> list[int]:
        """One decode step of this lane alone (as a step of one)."""
        outcome = self.step([LaneWorkItem(state, 0)])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def preempt(self, state: LaneState) -> None:
        """Its blocks (and a hybrid's state slot) back to the pool; it resumes by prefilling
        prompt + output again, from what the prefill cache holds of them (`resume`)."""
        sequence = state.sequence
        sequence.cache.release()  # one hold fewer on each block: those the cache holds stay
        state.claimed_blocks = 0
        drafter = self.runner.drafter
        if drafter is not None:
            sequence.drafter_state = drafter.start(sequence)
        self.counters.preemptions += 1

    def resume(self, state: LaneState) -> None:
        """A preempted lane admitted again: what the prefill cache holds of its tokens (its own
        prefix, stored before it was preempted, or another lane's) need not be computed again."""
        if not state.finished:
            self._reuse_prefix(state)

    def release(self, state: LaneState) -> None:
        state.sequence.cache.release()
        self._logprob_lanes.pop(state.sequence.request_id, None)
        if not self._logprob_lanes:
            # Observing copies the emitted rows out of the logits on every step, logprobs asked or
            # not: a kernel launch and a copy on a GPU, ~15 us a step on the tiny CPU model.
            self.runner.logits_observer = None

    def _after_prefill(self, state: LaneState) -> None:
        state.claimed_blocks = 0  # the plan of the step that ran it counted them
        if state.sequence.num_to_prefill == 0 and not state.stored:
            state.stored = True
            self._store_prefix(state.sequence)
        cache = state.sequence.cache
        if state.sequence.num_to_prefill == 0 and isinstance(cache, HybridCache | PagedHybridCache):
            cache.forget_snapshots()  # (a resumed lane's prefill kept them again)

    def _count_decode(self, state: LaneState, before: tuple[int, int, int], emitted: list[int]) -> None:
        stats, counters = state.stats, self.counters
        counters.tokens += len(emitted)
        counters.drafts += stats.drafts - before[0]
        counters.draft_tokens += stats.draft_tokens - before[1]
        counters.accepted_tokens += stats.accepted_tokens - before[2]
        _count_by_position(counters.accepted_by_position, stats.accepted_tokens - before[2])
        add_to_source(counters.by_source, stats.last_source, *(n - b for n, b in zip(_spec_counts(state), before)))

    def force_tokens(self, state: LaneState, token_ids: list[int]) -> list[int]:
        """Append tokens the model did not choose (a forced close tag); they are prefilled next turn."""
        sequence = state.sequence
        room = sequence.params.max_tokens - len(sequence.output_ids)
        forced = token_ids[: max(room, 0)]
        sequence.output_ids.extend(forced)
        self.counters.tokens += len(forced)
        if len(sequence.output_ids) >= sequence.params.max_tokens:
            sequence.finish_reason = "length"
            self.runner.finished(sequence)
        return forced

    def stop(self, state: LaneState) -> None:
        """A stop string ended the text: the lane is finished."""
        state.sequence.finish_reason = "stop"
        self.runner.finished(state.sequence)

    def _reuse_prefix(self, state: LaneState) -> None:
        cache, sequence = self.prefix_cache, state.sequence
        if cache is None:
            return
        if sequence.prompt_logprobs is not None and not sequence.prompt_logprobs.complete:
            return  # a cached prefix has no logits: its prompt is prefilled whole (worker.engine.prompt_logprobs)
        hit = cache.lookup(sequence.token_ids, sequence.num_tokens - 1)
        self.counters.prefix_cache_queries += 1
        if hit is None:
            return
        num = hit.num_tokens
        if isinstance(hit.target, HybridPrefix | HybridBlocks):  # the longest block prefix it kept a state for
            num = max((length for length in hit.target.states if length <= num), default=0)
            if num == 0:
                return
        self.counters.prefix_cache_hits += 1
        snapshot = hit.drafter
        drafter = self.runner.drafter
        if drafter is not None and num < hit.entry_tokens:
            assert reuses_prefixes(drafter)  # or the prefill cache would be off (__init__)
            snapshot = drafter.export_prefix(snapshot, num)
        pool, target = self.pool, hit.target
        if isinstance(target, HybridPrefix):
            self.runner.attach_prefix(sequence, target.cut(num), snapshot)
        elif pool is None:
            keys, values = target
            self.runner.attach_prefix(sequence, (keys[:, :, :num], values[:, :, :num]), snapshot)
        else:  # pool blocks (with a hybrid's states): count those the hit takes from the cache alone
            reclaimable = pool.allocator.num_reclaimable
            blocks = target.cut(num) if isinstance(target, HybridBlocks) else target[: num // pool.block_tokens]
            self.runner.attach_prefix(sequence, blocks, snapshot)
            state.claimed_blocks = reclaimable - pool.allocator.num_reclaimable
        state.prefix_tokens = num

    def _store_prefix(self, sequence: Sequence) -> None:
        cache = self.prefix_cache
        if cache is None or sequence.finished:
            return
        num = cache.storable_tokens(sequence.cache.length)
        token_ids = sequence.token_ids[:num]
        if num == 0 or cache.covers(token_ids):
            return
        target, snapshot = self.runner.export_prefix(sequence, num)
        drafter = self.runner.drafter
        if drafter is not None and snapshot is None:
            return  # the drafter could not cover this prefix; the pair is stored whole or not at all
        drafter_bytes = drafter.state_bytes(snapshot) if drafter else 0
        pool = self.pool
        if isinstance(target, list):  # the lane's pool blocks
            assert pool is not None
            if cache.insert(token_ids, target, snapshot, len(target) * pool.bytes_per_block + drafter_bytes):
                pool.allocator.share(target, by_cache=True)  # the entry's holds, dropped in _drop_entry
        elif isinstance(target, HybridBlocks):  # the lane's pool blocks and copies of its states
            assert pool is not None
            num_bytes = len(target.block_ids) * pool.bytes_per_block + target.state_bytes + drafter_bytes
            if cache.insert(token_ids, target, snapshot, num_bytes):
                pool.allocator.share(target.block_ids, by_cache=True)
        elif isinstance(target, HybridPrefix):
            cache.insert(token_ids, target, snapshot, target.num_bytes + drafter_bytes)
        else:
            keys, values = target
            cache.insert(token_ids, target, snapshot, 2 * keys.numel() * keys.element_size() + drafter_bytes)
        self.counters.prefix_cache_bytes = cache.num_bytes

    def _drop_entry(self, entry: PrefixEntry) -> None:
        """A prefill-cache entry left the cache: its holds on pool blocks go."""
        assert self.pool is not None
        target = entry.target
        self.pool.allocator.free(target.block_ids if isinstance(target, HybridBlocks) else target, by_cache=True)

    def _reclaim(self, num_blocks: int) -> None:
        """Free `num_blocks` more pool blocks (or all the cache can) by dropping prefill-cache
        entries, least recently used first; an entry whose blocks a lane holds too frees none."""
        pool, cache = self.pool, self.prefix_cache
        assert pool is not None and cache is not None
        wanted = pool.allocator.num_free + num_blocks
        while pool.allocator.num_free < wanted and cache.evict_oldest():
            pass
        self.counters.prefix_cache_bytes = cache.num_bytes

    def _observe_logits(self, sequence: Sequence, logits: torch.Tensor, emitted: list[int]) -> None:
        state = self._logprob_lanes.get(sequence.request_id)
        if state is None:
            return
        state.logprobs = [logprobs_of(row, token, state.num_logprobs or 0) for row, token in zip(logits, emitted)]


def _spec_counts(state: LaneState) -> tuple[int, int, int]:
    stats = state.stats
    return stats.drafts, stats.draft_tokens, stats.accepted_tokens


def _count_by_position(counts: list[int], num_accepted: int) -> None:
    # An accepted path is contiguous from depth 1, so accepting n tokens accepts positions 0..n-1.
    counts.extend([0] * (num_accepted - len(counts)))
    for position in range(num_accepted):
        counts[position] += 1
