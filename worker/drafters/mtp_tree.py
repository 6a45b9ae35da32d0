"""A draft tree from an MTP head: top-k branching at each depth under a node budget.

The search (worker.speculation.head_tree) decides which nodes to grow; this runs the head for
them. One head forward a depth, over the nodes grown at that depth in every lane: node n at
depth d is the pair (g_parent, x_n) at position num_observed - 1 + d, with g_parent the head's
output for its parent (for depth 1 the lane's `next_hidden`), written to the next free scratch
slot past the committed pairs, attending to the committed slots, its ancestors' scratch slots and
itself (head_rows.py); the draft vocabulary's top-k after it are its children, scored by
log-probability. Verification then runs the tree through the target's tree path, and the head's
cache keeps nothing of it: the next observation runs the head over the accepted path's pairs with
the target's own hidden states, as after a chain.

Cost against a chain of 3: a chain runs 2 head rows and 3 logits rows; a tree of 8 at depth <= 4
runs at most 3 forwards of at most `top_k` rows each, and the logits rows of each, for up to
8 verification rows where the head is unsure at several depths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from worker.drafters.draft_vocab import DraftVocabulary
from worker.drafters.head_rows import HeadRows
from worker.models.kv_cache import KVCache
from worker.speculation.head_tree import HeadTreeSearch
from worker.speculation.tree import ROOT, DraftTree

RunHead = Callable[
    [list[HeadRows], torch.Tensor], torch.Tensor
]  # MtpDrafter.run_head: rows, [R, hidden] -> [R, hidden]


class HeadLane(Protocol):
    """What a tree needs of a lane's head state (mtp.MtpState)."""

    cache: KVCache
    next_hidden: torch.Tensor | None
    num_observed: int
    head_rows: int


DEFAULT_TREE_BUDGET = 8
DEFAULT_TOP_K = 4
DEFAULT_MAX_DEPTH = 4


@dataclass(frozen=True, slots=True)
class TreeShape:
    budget: int = DEFAULT_TREE_BUDGET  # nodes at most
    top_k: int = DEFAULT_TOP_K  # children a node may have, and nodes grown a depth
    max_depth: int = DEFAULT_MAX_DEPTH


def grow_trees(
    run_head: RunHead, vocabulary: DraftVocabulary, states: Sequence[HeadLane], budgets: list[int], shape: TreeShape
) -> list[DraftTree]:
    """Each lane's best-first tree of budgets[i] nodes; every lane caught up (next_hidden set)."""
    searches = [HeadTreeSearch(budget, shape.top_k, shape.max_depth) for budget in budgets]
    first = torch.stack([state.next_hidden for state in states])  # type: ignore[misc]  # [B, hidden]
    for search, ranked in zip(searches, top_candidates(vocabulary, first, shape.top_k), strict=True):
        search.add_children(ROOT, ranked)
    node_hidden: list[dict[int, torch.Tensor]] = [{} for _ in states]  # lane -> node -> the head's g for it
    node_slot: list[dict[int, int]] = [{} for _ in states]  # lane -> grown node -> its scratch slot
    for depth in range(1, shape.max_depth):
        grown = [search.to_grow(depth) for search in searches]
        lanes, inputs, owners = [], [], []
        for lane, (state, search, nodes) in enumerate(zip(states, searches, grown, strict=True)):
            if not nodes:
                continue
            rows = _tree_rows(state, search, nodes, node_slot[lane])
            lanes.append(rows)
            owners.append(lane)
            for node in nodes:
                parent = search.nodes[node].parent
                inputs.append(first[lane] if parent == ROOT else node_hidden[lane][parent])
        if not lanes:
            break
        out = run_head(lanes, torch.stack(inputs))  # [R, hidden]
        ranked_rows = top_candidates(vocabulary, out, shape.top_k)
        row = 0
        for lane, rows in zip(owners, lanes, strict=True):
            states[lane].head_rows += rows.num_rows
            for i, node in enumerate(grown[lane]):
                node_hidden[lane][node] = out[row]
                node_slot[lane][node] = rows.start + i
                searches[lane].add_children(node, ranked_rows[row])
                row += 1
    return [search.tree() for search in searches]


def _tree_rows(state: HeadLane, search: HeadTreeSearch, nodes: list[int], slots: dict[int, int]) -> HeadRows:
    """One depth's grown nodes of a lane as tree rows after the scratch slots already used."""
    token_ids, positions, scratch = [], [], []
    for node in nodes:
        entry = search.nodes[node]
        token_ids.append(entry.token)
        positions.append(state.num_observed - 1 + entry.depth)
        ancestors, parent = [], entry.parent
        while parent != ROOT:
            ancestors.append(slots[parent])
            parent = search.nodes[parent].parent
        scratch.append(ancestors[::-1])
    return HeadRows(state.cache, token_ids, positions, state.cache.length + len(slots), scratch)


def top_candidates(vocabulary: DraftVocabulary, hidden: torch.Tensor, k: int) -> list[list[tuple[int, float]]]:
    """Per row of `hidden` [B, hidden]: the draft vocabulary's k likeliest tokens, (target id, logprob), best first."""
    logprobs = torch.log_softmax(vocabulary.logits(hidden).float(), dim=-1)  # [B, draft vocab]
    values, indices = logprobs.topk(min(k, logprobs.shape[-1]), dim=-1)
    tokens = vocabulary.to_target(indices).tolist()
    return [
        [(int(t), float(v)) for t, v in zip(row_tokens, row_values, strict=True) if v > -float("inf")]
        for row_tokens, row_values in zip(tokens, values.tolist(), strict=True)
    ]
