"""The model runner: one step over several sequences, each a prefill chunk or a draft -> verify
-> commit decode step, in one target forward.

It owns no scheduling policy: the scheduler (or `generate`) decides which sequences step
together and how large each prefill chunk is. A step runs in three phases, and a sequence whose
phase raises fails alone (its `LaneWork.error`) while the others go on:

    draft     per sequence (its drafter's proposal)
    forward   one target forward over every sequence's rows (should it raise, each sequence's
              rows run again alone, so only the one that cannot run fails)
    accept    per sequence: acceptance, commit, the drafter's observation

Everything here runs on the owner thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import Any

import torch

from shared.sampling import SamplingParams
from worker.engine.drafter_protocol import Drafter, TargetStates, learns_from_outputs, reuses_prefixes
from worker.engine.grammar_constraint import AnswerStart, GrammarConstraint, GrammarMasks
from worker.engine.logits_processing import make_generator
from worker.engine.prompt_logprobs import PromptLogprobs
from worker.engine.sequence import Sequence
from worker.engine.verifier import accept, takes_argmax, tree_inputs
from worker.models.decoder import Decoder, ForwardOutput, LaneRows
from worker.models.hybrid.hybrid_cache import HybridCache, HybridPrefix
from worker.models.hybrid.hybrid_pool import HybridBlocks, PagedHybridCache
from worker.models.kv_pool import KVPool, PagedKVCache
from worker.speculation.tree import ROOT, DraftTree

EMPTY_TREE = DraftTree([], [], [])
MAX_FORCED_DRAFT = 8  # tokens a grammar forces that one step verifies (rows the scheduler reserves for them)
GRAMMAR_SOURCE = "grammar"  # LaneWork.source of a draft the grammar forced
# A cached prefix's target half: its K/V (copied), the pool blocks holding them (shared), or
# for a hybrid model those with the recurrent states at its block boundaries.
PrefixKV = tuple[torch.Tensor, torch.Tensor] | list[int] | HybridPrefix | HybridBlocks
log = logging.getLogger(__name__)


class ContextLengthError(ValueError):
    """prompt + max_tokens does not fit the model's (or the worker's) context window."""


class NoStructuredOutputs(ValueError):
    """A constrained request for a runner without the model's tokenizer (see `grammar_masks`)."""


@dataclass(slots=True)
class LaneWork:
    """One sequence's part of a step: a prefill chunk (`num_prefill` > 0) or a decode step (0)."""

    sequence: Sequence
    num_prefill: int = 0
    emitted: list[int] = field(default_factory=list)  # a decode step's tokens (already in output_ids)
    error: Exception | None = None  # its step failed: the sequence must not step again
    tree: DraftTree = field(default_factory=lambda: EMPTY_TREE)
    rows: LaneRows | None = None
    out: ForwardOutput | None = None
    proposed: bool = False  # its tree came from the drafter's batched proposal
    observed: TargetStates | None = None  # what the drafter is shown once the step is committed
    targets: list[int] | None = None  # its rows' argmaxes, where each row's token is just that
    forced: list[int] = field(default_factory=list)  # tokens its grammar forces after the root
    source: str = ""  # where its draft came from: the drafter's name, GRAMMAR_SOURCE, "" (none)
    num_accepted: int = 0  # draft nodes the step accepted
    offered_next: bool = False  # the last accepted node (or the root) had a drafted child, refused

    @property
    def is_prefill(self) -> bool:
        return self.num_prefill > 0

    @property
    def num_rows(self) -> int:
        return 0 if self.rows is None else len(self.rows.token_ids)


class ModelRunner:
    def __init__(
        self,
        decoder: Decoder,
        eos_token_ids: Seq[int],
        drafter: Drafter | None = None,
        max_context: int | None = None,
        max_draft_nodes: int = 16,
    ):
        self.decoder = decoder
        self.eos_token_ids = frozenset(eos_token_ids)
        self.drafter = drafter
        self.max_context = min(
            max_context or decoder.config.max_position_embeddings, decoder.config.max_position_embeddings
        )
        self.max_draft_nodes = max_draft_nodes  # scratch slots a verification may need past the context
        # Called after each decode step with the raw logits rows [num_emitted, vocab] that chose the
        # emitted tokens (logprobs for the serving side); None costs nothing.
        self.logits_observer: Callable[[Sequence, torch.Tensor, list[int]], None] | None = None
        # Structured outputs' masks; set where the tokenizer is known (worker.serving_model).
        self.grammar_masks: GrammarMasks | None = None
        self.forced_drafts = True  # a grammar's forced tokens are drafted (`_force`); False: the plain path

    @property
    def vocab_size(self) -> int:
        return self.decoder.config.vocab_size

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        if num_prompt_tokens < 1:
            raise ContextLengthError("the prompt is empty: at least one token is needed")
        if num_prompt_tokens + max_tokens > self.max_context:
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_context} tokens, but the request has "
                f"{num_prompt_tokens} prompt tokens and max_tokens={max_tokens}"
            )

    def start(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        resumed_ids: Seq[int] = (),
        pool: KVPool | None = None,
        num_prompt_logprobs: int | None = None,
    ) -> Sequence:
        """A new sequence; `resumed_ids` are tokens already emitted for it (by a worker that died).
        Its K/V live in blocks of `pool` (serving; a hybrid's recurrent state in a slot of the
        pool's) or else in a buffer of its own (generate, tests). `num_prompt_logprobs`: its prefill
        records the prompt's logprobs with that many top tokens (`sequence.prompt_logprobs`)."""
        self.check_fits(len(prompt_ids), params.max_tokens)
        capacity = len(prompt_ids) + params.max_tokens + self.max_draft_nodes + 1
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        sequence = Sequence(
            request_id,
            list(prompt_ids),
            params,
            pool.new_cache(capacity) if pool is not None else self.decoder.new_cache(capacity),
            make_generator(params.seed),
            output_ids=list(resumed_ids),
            stop_ids=stop_ids,
        )
        if num_prompt_logprobs is not None:
            sequence.prompt_logprobs = PromptLogprobs(len(prompt_ids), num_prompt_logprobs)
        if params.structured is not None:
            sequence.constraint = self._constraint(params, stop_ids)
        if self.drafter is not None:
            sequence.drafter_state = self.drafter.start(sequence)
        self._finish_if_done(sequence)
        return sequence

    def _constraint(self, params: SamplingParams, stop_ids: frozenset[int]) -> GrammarConstraint:
        """The sequence's grammar: compiled once per worker (by the intake, off this thread), copied here."""
        masks = self.grammar_masks
        if masks is None:
            raise NoStructuredOutputs(
                "structured outputs need the model's tokenizer: load it with worker.serving_model"
            )
        assert params.structured is not None
        matcher = masks.compile(params.structured.check())
        after = params.constraint_after
        answer_start = AnswerStart(after, masks.token_text) if after else None
        return GrammarConstraint(masks, matcher, stop_ids, answer_start)

    def prefill(self, sequence: Sequence, max_chunk: int) -> None:
        """Run up to `max_chunk` of the tokens before the root through the target (and drafter)."""
        self._step_alone(LaneWork(sequence, min(max_chunk, sequence.num_to_prefill)))

    def decode_step(self, sequence: Sequence) -> list[int]:
        """One draft -> verify -> commit cycle; returns the tokens emitted (already in output_ids)."""
        return self._step_alone(LaneWork(sequence)).emitted

    def step(self, works: Seq[LaneWork]) -> None:
        """One step of every work's sequence; each work's `emitted` or `error` says how it went."""
        started = time.perf_counter()
        for work in works:
            assert not work.sequence.finished and (work.is_prefill or work.sequence.num_to_prefill == 0)
        decoding = [work for work in works if not work.is_prefill]
        for work in decoding:
            self._guarded(work, self._force)
        self._propose_together([work for work in decoding if len(work.forced) < 2])
        for work in works:
            self._guarded(work, self._draft)
        drafted = time.perf_counter()
        self._forward_all([work for work in works if work.error is None])
        self._argmax_together([work for work in works if work.error is None and not work.is_prefill])
        for work in works:
            self._guarded(work, self._finish)
        self._observe_together([work for work in works if work.error is None and work.observed is not None])
        for work in works:
            self._account(work, started, drafted)
            work.out = work.observed = None  # the step's tensors go with the step

    def _propose_together(self, works: list[LaneWork]) -> None:
        """Drafts for every decoding lane from one call, where the drafter batches them (`propose_many`)."""
        drafter = self.drafter
        drafting = [work for work in works if work.sequence.draft_limit != 0 and work.error is None]
        if drafter is None or len(drafting) < 2 or not hasattr(drafter, "propose_many"):
            return
        try:
            trees = drafter.propose_many([(work.sequence.drafter_state, work.sequence) for work in drafting])
        except Exception:  # one lane's state broke the batch: each lane drafts alone (in _draft)
            log.exception("batched drafting failed; the lanes draft one by one")
            return
        for work, tree in zip(drafting, trees, strict=True):
            work.tree, work.proposed = self._checked(work.sequence, tree), True

    def _observe_together(self, works: list[LaneWork]) -> None:
        """The drafter sees what every lane committed, in one call where it batches (`observe_many`)."""
        drafter = self.drafter
        if drafter is None or not works:
            return
        if len(works) > 1 and hasattr(drafter, "observe_many"):
            try:
                drafter.observe_many([(work.sequence.drafter_state, work.observed) for work in works])
                return
            except Exception:  # see which lane cannot be observed: each alone
                log.exception("batched observation failed; the lanes are observed one by one")
        for work in works:
            self._guarded(work, self._observe_alone)

    def _observe_alone(self, work: LaneWork) -> None:
        assert self.drafter is not None and work.observed is not None
        self.drafter.observe(work.sequence.drafter_state, work.observed)

    def _step_alone(self, work: LaneWork) -> LaneWork:
        self.step([work])
        if work.error is not None:
            raise work.error
        return work

    def _guarded(self, work: LaneWork, phase: Callable[[LaneWork], None]) -> None:
        if work.error is not None:
            return
        try:
            phase(work)
        except Exception as error:  # this sequence's failure; the step's other sequences go on
            work.error = error

    def _draft(self, work: LaneWork) -> None:
        sequence = work.sequence
        start = sequence.cache.length
        if work.is_prefill:
            token_ids = sequence.token_ids[start : start + work.num_prefill]
            sequence.cache.reserve(start + work.num_prefill)
            num_logits = 0 if _prompt_scored(sequence) else None  # None: every row's, to score the prompt
            work.rows = LaneRows(
                token_ids, list(range(start, start + work.num_prefill)), sequence.cache, None, num_logits
            )
            return
        if not work.proposed and len(work.forced) < 2:
            work.tree = self._propose(sequence)
        if work.forced and not _starts_with(work.tree, work.forced):
            work.tree = DraftTree.chain(work.forced, GRAMMAR_SOURCE)
        if work.tree.num_nodes:  # a drafter of several sources names each tree's
            work.source = work.tree.source or getattr(self.drafter, "name", "")
        token_ids, positions, mask = tree_inputs(sequence, work.tree)
        sequence.cache.reserve(start + len(token_ids))
        work.rows = LaneRows(token_ids, positions, sequence.cache, mask, None)

    def _force(self, work: LaneWork) -> None:
        """The tokens the lane's grammar allows exactly one way: a draft that is always accepted.

        Ahead of the drafter, whatever the mode (`none` too) and whatever adaptive speculation
        chose: where a JSON schema leaves one way on (a key, `": "`, a closing brace) a step
        verifies several tokens for the price of a few more rows. The drafter's own tree is kept
        where it already starts with them (it may guess further); two forced tokens or more
        and the drafter is not asked."""
        sequence = work.sequence
        if sequence.constraint is None or not self.forced_drafts:
            return
        room = sequence.params.max_tokens - len(sequence.output_ids) - 1  # the bonus token comes anyway
        limit = min(MAX_FORCED_DRAFT, self.max_draft_nodes, room)
        work.forced = sequence.constraint.forced_tokens(sequence.output_ids, limit) if limit > 0 else []

    def _forward_all(self, works: list[LaneWork]) -> None:
        if not works:
            return
        try:
            outs = self._forward([work.rows for work in works if work.rows is not None])
        except Exception as error:
            if len(works) == 1:
                works[0].error = error
                return
            for work in works:  # find the one that cannot run: each alone
                self._guarded(work, self._forward_alone)
            return
        for work, out in zip(works, outs, strict=True):
            work.out = out

    def _argmax_together(self, works: list[LaneWork]) -> None:
        """The rows' argmaxes of every lane that takes them as its tokens, read back in one
        device-to-host transfer for the step (not one per lane)."""
        greedy = [(work, work.out.logits) for work in works if work.out is not None and takes_argmax(work.sequence)]
        if len(greedy) < 2:
            return
        flat = torch.cat([logits.argmax(dim=-1) for _, logits in greedy]).tolist()
        first = 0
        for work, logits in greedy:
            work.targets, first = flat[first : first + logits.shape[0]], first + logits.shape[0]

    def _forward_alone(self, work: LaneWork) -> None:
        assert work.rows is not None
        work.out = self._forward([work.rows])[0]

    def _finish(self, work: LaneWork) -> None:
        sequence, out, rows = work.sequence, work.out, work.rows
        assert out is not None and rows is not None
        start = sequence.cache.length
        if work.is_prefill:
            if not _prompt_scored(sequence):
                assert sequence.prompt_logprobs is not None
                sequence.prompt_logprobs.record(start, out.logits, sequence.token_ids)
            sequence.cache.commit(work.num_prefill)
            work.observed = self._observe(sequence, rows.token_ids, start, out, rows=None)
            self._finish_if_done(sequence)  # max_tokens 0: done once the prompt is scored
            return
        tree = work.tree
        verdict = accept(sequence, tree, out.logits, work.targets)
        kept = [0] + [node + 1 for node in verdict.accepted_nodes]
        sequence.cache.commit(1 + tree.num_nodes, kept)
        committed = [sequence.root_token] + [tree.tokens[node] for node in verdict.accepted_nodes]
        emitted = self._truncate(sequence, verdict.emitted)
        if self.logits_observer is not None:
            self.logits_observer(sequence, out.logits[kept[: len(emitted)]], emitted)  # row i chose emitted[i]
        sequence.output_ids.extend(emitted)
        work.observed = self._observe(sequence, committed, start, out, kept, next_token=verdict.emitted[-1])
        sequence.stats.record_step(tree.num_nodes, len(verdict.accepted_nodes), len(emitted), work.source)
        work.emitted = emitted
        work.num_accepted = len(verdict.accepted_nodes)
        last = verdict.accepted_nodes[-1] if verdict.accepted_nodes else ROOT
        work.offered_next = last in tree.parents
        if sequence.finished:
            self.finished(sequence)

    def finished(self, sequence: Sequence) -> None:
        """`sequence` just got its finish reason (here, or a stop string in the text pipeline): a
        drafter that learns from outputs (suffix decoding) takes its output."""
        if learns_from_outputs(self.drafter):
            self.drafter.finish(sequence.drafter_state, sequence)

    def _account(self, work: LaneWork, started: float, drafted: float) -> None:
        """The step's time, to each of its sequences: what each waited for its tokens."""
        stats, now = work.sequence.stats, time.perf_counter()
        if work.is_prefill:
            stats.prefill_tokens += work.num_prefill
            stats.prefill_s += now - started
        else:
            stats.draft_s += drafted - started
            stats.verify_s += now - drafted

    def attach_prefix(self, sequence: Sequence, target: PrefixKV, drafter_snapshot: Any) -> None:
        """Continue a fresh sequence from a cached prefix of n tokens and the drafter's snapshot of
        the same n tokens. The target's half is its K/V ([layers, kv_heads, n, head_dim] each,
        copied in) or, for a lane in the KV pool, the ids of the pool blocks that hold them
        (shared: the lane becomes one more holder of each), or for a hybrid model its K/V (or
        blocks) and recurrent states (HybridPrefix, HybridBlocks)."""
        cache = sequence.cache
        assert cache.length == 0, cache.length
        if isinstance(target, list):
            assert isinstance(cache, PagedKVCache), type(cache)
            cache.share_prefix(target)
        elif isinstance(target, HybridBlocks):
            assert isinstance(cache, PagedHybridCache), type(cache)
            cache.share_hybrid_prefix(target)
        elif isinstance(target, HybridPrefix):
            assert isinstance(cache, HybridCache), type(cache)
            cache.load_prefix(target)
        else:
            cache.load_prefix(*target)
        assert 0 < cache.length < sequence.num_tokens, (cache.length, sequence.num_tokens)
        drafter = self.drafter
        if drafter is not None:
            assert reuses_prefixes(drafter)  # the prefill cache is off for any other drafter (ModelStepper)
            sequence.drafter_state = drafter.import_prefix(sequence, drafter_snapshot)

    def export_prefix(self, sequence: Sequence, num_tokens: int) -> tuple[PrefixKV, Any]:
        """The target's half of the first `num_tokens` committed tokens and the drafter's snapshot.
        For a lane in the KV pool the target's half is the blocks holding them (whole blocks; the
        caller `share`s them; a hybrid's come with copies of its recurrent states: HybridBlocks),
        else copies of their K/V (for a hybrid model with its recurrent states: HybridPrefix)."""
        cache = sequence.cache
        target: PrefixKV
        if isinstance(cache, PagedHybridCache):
            target = cache.prefix(num_tokens)
        elif isinstance(cache, PagedKVCache):
            target = cache.prefix_blocks(num_tokens)
        else:
            target = cache.prefix_kv(num_tokens)
        drafter = self.drafter
        if drafter is None:
            return target, None
        assert reuses_prefixes(drafter)  # the prefill cache is off for any other drafter (ModelStepper)
        return target, drafter.export_prefix(sequence.drafter_state, num_tokens)

    def _propose(self, sequence: Sequence) -> DraftTree:
        limit = sequence.draft_limit
        if self.drafter is None or limit == 0:
            return EMPTY_TREE
        return self._checked(sequence, self.drafter.propose(sequence.drafter_state, sequence))

    def _checked(self, sequence: Sequence, tree: DraftTree | None) -> DraftTree:
        if tree is None:
            return EMPTY_TREE
        assert tree.num_nodes <= self.max_draft_nodes, (tree.num_nodes, self.max_draft_nodes)
        limit = sequence.draft_limit
        return tree if limit is None else tree.truncated(limit)

    def _forward(self, rows: list[LaneRows]) -> list[ForwardOutput]:
        decoder, drafter = self.decoder, self.drafter
        hidden_layers = drafter.hidden_layers if drafter else ()
        want_final_hidden = bool(drafter and drafter.wants_final_hidden)
        return decoder.forward_lanes(rows, hidden_layers, want_final_hidden)

    def _observe(
        self,
        sequence: Sequence,
        token_ids: list[int],
        start: int,
        out: ForwardOutput,
        rows: list[int] | None,
        next_token: int | None = None,
    ) -> TargetStates | None:
        """The target states of the tokens just committed (rows of this forward), for the drafter."""
        if self.drafter is None or sequence.finished:
            return None
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        hidden = {layer: pick(h) for layer, h in out.hidden.items()}
        final = pick(out.final_hidden) if out.final_hidden is not None else None
        if next_token is None:
            next_token = sequence.token_ids[start + len(token_ids)]
        return TargetStates(token_ids, start, hidden, final, next_token)

    def _truncate(self, sequence: Sequence, emitted: list[int]) -> list[int]:
        """Cut at the first end-of-sequence token and at max_tokens; set the finish reason."""
        params = sequence.params
        for i, token in enumerate(emitted):
            if token in sequence.stop_ids:
                emitted = emitted[: i + 1]
                sequence.finish_reason = "stop"
                break
        room = params.max_tokens - len(sequence.output_ids)
        if len(emitted) >= room:
            if len(emitted) > room or sequence.finish_reason is None:
                sequence.finish_reason = "length"
            emitted = emitted[:room]
        return emitted

    def _finish_if_done(self, sequence: Sequence) -> None:
        if not _prompt_scored(sequence):
            return  # its prompt's logprobs are still to come from its prefill
        if len(sequence.output_ids) >= sequence.params.max_tokens:
            sequence.finish_reason = "length"
        elif sequence.output_ids and sequence.output_ids[-1] in sequence.stop_ids:
            sequence.finish_reason = "stop"


def _starts_with(tree: DraftTree, tokens: list[int]) -> bool:
    """Whether the tree holds `tokens` as a path from the root (the drafter guessed them too)."""
    node = ROOT
    for token in tokens:
        child = tree.child_with_token(node, token)
        if child is None:
            return False
        node = child
    return True


def _prompt_scored(sequence: Sequence) -> bool:
    """Not asked for, or all recorded: its prefill needs no logits."""
    return sequence.prompt_logprobs is None or sequence.prompt_logprobs.complete
