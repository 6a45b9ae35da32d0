"""A random DFlash drafter steered towards the target's greedy continuation, for tests that need
drafts both accepted and rejected.

A random drafter almost never agrees with a random target, so a run through it verifies trees
that are rejected at their first node. This one keeps the drafter's real context (its `observe`
of the target's hidden states, its block forward) but raises, in its block logits, the reference
token at the first few depths: 0 to 3 of them, cycling step by step. Those drafts are accepted;
the random guesses past them mostly are not (TREE_STEER: how a tree differs). Off the reference
(sampling, or another prompt) it drafts what the random drafter drafts.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

import torch

from worker.drafters.dflash import DFlashDrafter
from worker.engine.drafter_protocol import TargetStates
from worker.engine.sequence import Sequence
from worker.speculation.tree import DraftTree, build_best_first_tree

STEER = 5.0  # logits above the row's best: in a chain the reference token becomes the best, by a margin
# In a tree it comes second, just below the random guess, so the accepted path is not the first
# nodes of the tree (best-first order) but skips rows: the case where a prefix would be wrong.
TREE_STEER = -0.1


class SteeredDFlash:
    def __init__(self, inner: DFlashDrafter, references: Seq[Seq[int]], tree_budget: int | None = None):
        """references: prompt + greedy continuation for each prompt the drafter will see."""
        self.inner, self.references, self.tree_budget = inner, [list(r) for r in references], tree_budget
        self.name = "steered-tree" if tree_budget is not None else "steered-dflash"
        self.hidden_layers, self.wants_final_hidden = inner.hidden_layers, inner.wants_final_hidden

    def start(self, sequence: Sequence) -> Any:
        return self.inner.start(sequence)

    def observe(self, state: Any, committed: TargetStates) -> None:
        self.inner.observe(state, committed)

    def state_bytes(self, state: Any) -> int:
        return self.inner.state_bytes(state)

    def propose(self, state: Any, sequence: Sequence) -> DraftTree | None:
        logits = self.inner.block_logits(state, sequence.root_token).clone()  # [block_size - 1, vocab]
        self._steer(logits, sequence)
        depth = min(self.inner.num_draft, logits.shape[0])
        if self.tree_budget is None:
            return DraftTree.chain(logits[:depth].argmax(dim=-1).tolist())
        top = torch.topk(torch.log_softmax(logits[:depth].float(), dim=-1), self.inner.tree_top_k, dim=-1)
        candidates = [
            [(token, min(logprob, 0.0)) for token, logprob in zip(tokens, values)]
            for tokens, values in zip(top.indices.tolist(), top.values.tolist())
        ]
        return build_best_first_tree(candidates, self.tree_budget)

    def _steer(self, logits: torch.Tensor, sequence: Sequence) -> None:
        token_ids, num_tokens = sequence.token_ids, sequence.num_tokens
        reference = next((r for r in self.references if r[:num_tokens] == token_ids), None)
        if reference is None:
            return
        num_right = sequence.stats.target_forwards % 4  # 0..3 right drafts, step by step
        ahead = reference[num_tokens : num_tokens + num_right]
        steer = STEER if self.tree_budget is None else TREE_STEER
        for depth, token in enumerate(ahead[: logits.shape[0]]):
            best = logits[depth].max()
            logits[depth, token] = best if logits[depth].argmax() == token else best + steer
