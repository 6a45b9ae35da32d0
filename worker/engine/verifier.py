"""Verification: one target forward over root + draft tree, then the lossless acceptance walk.

The verifier decides, row by row, which token the target itself emits after each path; the
walk in `worker.speculation.tree` then follows drafted children that agree. Rows are computed
lazily, so a rejected branch costs nothing beyond the shared forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.logits_processing import changes_greedy_choice, greedy_token, process_logits, sample_from
from worker.engine.sequence import Sequence
from worker.speculation.tree import ROOT, DraftTree, walk


@dataclass(slots=True)
class Verdict:
    accepted_nodes: list[int]  # node indices along the accepted path
    emitted: list[int]  # accepted tokens + the target's bonus token


def tree_inputs(sequence: Sequence, tree: DraftTree) -> tuple[list[int], list[int], torch.Tensor | None]:
    """Token ids [1+n], positions [1+n] and the [1+n, 1+n] attention mask (None for a chain: causal)."""
    token_ids = [sequence.root_token, *tree.tokens]
    start = sequence.cache.length
    positions = [start, *(start + d for d in tree.depths)]
    if tree.is_chain:
        return token_ids, positions, None
    device = sequence.cache.device
    mask = torch.zeros(1 + tree.num_nodes, 1 + tree.num_nodes, dtype=torch.bool, device=device)
    mask[:, 0] = True  # every node sees the root
    mask[1:, 1:] = torch.tensor(tree.ancestor_mask(), dtype=torch.bool, device=device)
    return token_ids, positions, mask


def takes_argmax(sequence: Sequence) -> bool:
    """Whether every row's token is simply its logits' argmax: greedy, nothing that moves the
    argmax, and past min_tokens (every node's history is longer still)."""
    params = sequence.params
    return params.greedy and not changes_greedy_choice(params) and len(sequence.output_ids) >= params.min_tokens


def accept(sequence: Sequence, tree: DraftTree, logits: torch.Tensor, targets: list[int] | None = None) -> Verdict:
    """logits: [1+n, vocab], row 0 after the root, row i+1 after node i. `targets`: the rows'
    argmaxes where the caller has them already (read for every lane of a step at once)."""
    params = sequence.params
    if takes_argmax(sequence):
        if targets is None:
            targets = logits.argmax(dim=-1).tolist()  # one pass for every row
        accepted, emitted = walk(tree, lambda node: targets[node + 1])
        return Verdict(accepted, emitted)

    def next_token_at(node: int) -> int:
        history = (
            sequence.output_ids + [tree.tokens[i] for i in tree.path_to(node)] if node != ROOT else sequence.output_ids
        )
        constraint = sequence.constraint
        allowed = None if constraint is None else constraint.mask(history, len(sequence.output_ids))
        row = process_logits(
            logits[node + 1 : node + 2], params, sequence.prompt_ids, [history], sequence.stop_ids, allowed
        )[0]
        return greedy_token(row) if params.greedy else sample_from(row, sequence.generator)

    accepted, emitted = walk(tree, next_token_at)
    return Verdict(accepted, emitted)
