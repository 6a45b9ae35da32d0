"""The model runner: prefill chunks and draft -> verify -> commit decode steps for one sequence.

It owns no scheduling policy: the scheduler (or `generate`) decides which sequence steps next
and how large a prefill chunk may be. Everything here runs on the owner thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

import torch

from shared.sampling import SamplingParams
from worker.drafters.base import Drafter, TargetStates, reuses_prefixes
from worker.engine.grammar_constraint import AnswerStart, GrammarConstraint, GrammarMasks
from worker.engine.logits_processing import make_generator
from worker.engine.sequence import Sequence
from worker.engine.verifier import accept, tree_inputs
from worker.models.decoder import Decoder, ForwardOutput
from worker.speculation.tree import DraftTree

EMPTY_TREE = DraftTree([], [], [])


class ContextLengthError(ValueError):
    """prompt + max_tokens does not fit the model's (or the worker's) context window."""


class NoStructuredOutputs(ValueError):
    """A constrained request for a runner without the model's tokenizer (see `grammar_masks`)."""


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

    @property
    def vocab_size(self) -> int:
        return self.decoder.config.vocab_size

    @property
    def reuses_prefixes(self) -> bool:
        """Whether a cached prefix's K/V can stand in for prefilling it: not for a hybrid model,
        whose recurrent layers keep state that is not K/V (worker/models/hybrid/)."""
        return isinstance(self.decoder, Decoder)

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        if num_prompt_tokens < 1:
            raise ContextLengthError("the prompt is empty: at least one token is needed")
        if num_prompt_tokens + max_tokens > self.max_context:
            raise ContextLengthError(
                f"this model's maximum context length is {self.max_context} tokens, but the request has "
                f"{num_prompt_tokens} prompt tokens and max_tokens={max_tokens}"
            )

    def start(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, resumed_ids: Seq[int] = ()
    ) -> Sequence:
        """A new sequence; `resumed_ids` are tokens already emitted for it (by a worker that died)."""
        self.check_fits(len(prompt_ids), params.max_tokens)
        capacity = len(prompt_ids) + params.max_tokens + self.max_draft_nodes + 1
        stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_token_ids)
        sequence = Sequence(
            request_id,
            list(prompt_ids),
            params,
            self.decoder.new_cache(capacity),
            make_generator(params.seed),
            output_ids=list(resumed_ids),
            stop_ids=stop_ids,
        )
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
        started = time.perf_counter()
        start = sequence.cache.length
        num = min(max_chunk, sequence.num_to_prefill)
        token_ids = sequence.token_ids[start : start + num]
        out = self._forward(torch.tensor(token_ids), torch.arange(start, start + num), sequence, None, num_logits=0)
        sequence.cache.commit(num)
        self._observe(sequence, token_ids, start, out, rows=None)
        sequence.stats.prefill_tokens += num
        sequence.stats.prefill_s += time.perf_counter() - started

    def decode_step(self, sequence: Sequence) -> list[int]:
        """One draft -> verify -> commit cycle; returns the tokens emitted (already in output_ids)."""
        assert sequence.num_to_prefill == 0 and not sequence.finished
        started = time.perf_counter()
        tree = self._propose(sequence)
        drafted = time.perf_counter()
        token_ids, positions, mask = tree_inputs(sequence, tree)
        out = self._forward(token_ids, positions, sequence, mask, num_logits=None)
        verdict = accept(sequence, tree, out.logits)
        rows = [0] + [node + 1 for node in verdict.accepted_nodes]
        start = sequence.cache.length
        sequence.cache.commit(1 + tree.num_nodes, rows)
        committed = [sequence.root_token] + [tree.tokens[node] for node in verdict.accepted_nodes]
        emitted = self._truncate(sequence, verdict.emitted)
        if self.logits_observer is not None:
            self.logits_observer(sequence, out.logits[rows[: len(emitted)]], emitted)  # row i chose emitted[i]
        sequence.output_ids.extend(emitted)
        self._observe(sequence, committed, start, out, rows, next_token=verdict.emitted[-1])
        stats = sequence.stats
        stats.record_step(tree.num_nodes, len(verdict.accepted_nodes), len(emitted))
        stats.draft_s += drafted - started
        stats.verify_s += time.perf_counter() - drafted
        return emitted

    def attach_prefix(
        self, sequence: Sequence, keys: torch.Tensor, values: torch.Tensor, drafter_snapshot: Any
    ) -> None:
        """Continue a fresh sequence from a cached prefix: the target's K/V for its first n tokens
        ([layers, kv_heads, n, head_dim] each) and the drafter's snapshot of the same n tokens."""
        num_tokens = keys.shape[2]
        assert sequence.cache.length == 0 and 0 < num_tokens < sequence.num_tokens, (num_tokens, sequence.num_tokens)
        sequence.cache.load_prefix(keys, values)
        drafter = self.drafter
        if drafter is not None:
            assert reuses_prefixes(drafter)  # the prefill cache is off for any other drafter (ModelStepper)
            sequence.drafter_state = drafter.import_prefix(sequence, drafter_snapshot)

    def export_prefix(self, sequence: Sequence, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Copies of the target's K/V for the first `num_tokens` committed tokens, and the drafter's snapshot."""
        cache = sequence.cache
        assert 0 < num_tokens <= cache.length, (num_tokens, cache.length)
        keys = cache.keys[:, :, :num_tokens].clone()  # [layers, kv_heads, n, head_dim]
        values = cache.values[:, :, :num_tokens].clone()
        drafter = self.drafter
        if drafter is None:
            return keys, values, None
        assert reuses_prefixes(drafter)  # the prefill cache is off for any other drafter (ModelStepper)
        snapshot = drafter.export_prefix(sequence.drafter_state, num_tokens)
        return keys, values, snapshot

    def _propose(self, sequence: Sequence) -> DraftTree:
        if self.drafter is None:
            return EMPTY_TREE
        tree = self.drafter.propose(sequence.drafter_state, sequence)
        if tree is None:
            return EMPTY_TREE
        assert tree.num_nodes <= self.max_draft_nodes, (tree.num_nodes, self.max_draft_nodes)
        return tree

    def _forward(
        self,
        token_ids: torch.Tensor,
        positions: torch.Tensor,
        sequence: Sequence,
        mask: torch.Tensor | None,
        num_logits: int | None,
    ) -> ForwardOutput:
        drafter = self.drafter
        return self.decoder(
            token_ids,
            positions,
            sequence.cache,
            tree_mask=mask,
            hidden_layers=drafter.hidden_layers if drafter else (),
            want_final_hidden=bool(drafter and drafter.wants_final_hidden),
            num_logits=num_logits,
        )

    def _observe(
        self,
        sequence: Sequence,
        token_ids: list[int],
        start: int,
        out: ForwardOutput,
        rows: list[int] | None,
        next_token: int | None = None,
    ) -> None:
        """Hand the drafter the target states of the tokens just committed (rows of this forward)."""
        if self.drafter is None or sequence.finished:
            return
        pick = (lambda t: t) if rows is None else (lambda t: t[rows])
        hidden = {layer: pick(h) for layer, h in out.hidden.items()}
        final = pick(out.final_hidden) if out.final_hidden is not None else None
        if next_token is None:
            next_token = sequence.token_ids[start + len(token_ids)]
        self.drafter.observe(sequence.drafter_state, TargetStates(token_ids, start, hidden, final, next_token))

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
        if len(sequence.output_ids) >= sequence.params.max_tokens:
            sequence.finish_reason = "length"
        elif sequence.output_ids and sequence.output_ids[-1] in sequence.stop_ids:
            sequence.finish_reason = "stop"
