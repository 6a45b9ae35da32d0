import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.speculation.tree import ROOT, DraftTree, build_best_first_tree, walk


@st.composite
def candidate_lists(draw, max_depth: int = 5, max_k: int = 4):
    """Per-depth top-k lists, sorted descending; coarse logprobs so that ties actually happen."""
    depth = draw(st.integers(0, max_depth))
    candidates = []
    for _ in range(depth):
        k = draw(st.integers(1, max_k))
        tokens = draw(st.lists(st.integers(0, 50), min_size=k, max_size=k, unique=True))
        logprobs = sorted(draw(st.lists(st.sampled_from([0.0, -0.5, -1.0, -2.0, -3.5]), min_size=k, max_size=k)))
        candidates.append(list(zip(tokens, reversed(logprobs))))
    return candidates


def node_scores(tree: DraftTree, candidates) -> list[float]:
    by_depth = [dict(ranked) for ranked in candidates]
    return [sum(by_depth[tree.depths[j] - 1][tree.tokens[j]] for j in tree.path_to(i)) for i in range(tree.num_nodes)]


def all_path_scores(candidates) -> list[float]:
    scores = []
    for depth in range(1, len(candidates) + 1):
        for combo in itertools.product(*candidates[:depth]):
            scores.append(sum(logprob for _, logprob in combo))
    return scores


def test_chain_constructor_builds_a_path():
    tree = DraftTree.chain([7, 8, 9])
    assert tree.parents == [ROOT, 0, 1]
    assert tree.depths == [1, 2, 3]
    assert tree.is_chain
    assert tree.path_to(2) == [0, 1, 2]
    assert tree.child_with_token(ROOT, 7) == 0
    assert tree.child_with_token(0, 8) == 1
    assert tree.child_with_token(0, 9) is None


def test_branching_tree_is_not_a_chain_and_masks_ancestors_only():
    #   root -> 0(a) -> 1(b)
    #        -> 2(c) -> 3(d)
    tree = DraftTree([1, 2, 3, 4], [ROOT, 0, ROOT, 2], [1, 2, 1, 2])
    assert not tree.is_chain
    assert tree.path_to(3) == [2, 3]
    assert tree.ancestor_mask() == [
        [True, False, False, False],
        [True, True, False, False],
        [False, False, True, False],
        [False, False, True, True],
    ]


def test_one_node_per_depth_out_of_path_is_not_a_chain():
    # Depths 1 and 2 each hold one node, but node 1 hangs off the root, so it is not a path.
    assert not DraftTree([1, 2], [ROOT, ROOT], [1, 1]).is_chain


@pytest.mark.parametrize(
    "tokens, parents, depths",
    [
        ([1, 2], [ROOT, 1], [1, 2]),  # parent after child
        ([1, 2], [ROOT, 0], [1, 3]),  # wrong depth
        ([1, 1], [ROOT, ROOT], [1, 1]),  # duplicate sibling token
        ([1, 2], [ROOT], [1, 2]),  # ragged
    ],
)
def test_malformed_tree_is_rejected(tokens, parents, depths):
    with pytest.raises(ValueError):
        DraftTree(tokens, parents, depths)


def test_worked_example_from_the_builder_comment():
    a, b, c, d = 10, 11, 12, 13
    candidates = [[(a, -0.1), (b, -1.0)], [(c, -0.2), (d, -2.0)]]
    tree = build_best_first_tree(candidates, budget=4)
    assert tree.tokens == [a, c, b, c]
    assert tree.parents == [ROOT, 0, ROOT, 2]
    assert tree.depths == [1, 2, 1, 2]


def test_one_candidate_per_depth_gives_a_chain():
    candidates = [[(t, -0.3)] for t in range(6)]
    tree = build_best_first_tree(candidates, budget=4)
    assert tree.is_chain
    assert tree.tokens == [0, 1, 2, 3]


def test_invalid_candidates_are_rejected():
    with pytest.raises(ValueError, match="sorted"):
        build_best_first_tree([[(1, -2.0), (2, -1.0)]], budget=2)
    with pytest.raises(ValueError, match="<= 0"):
        build_best_first_tree([[(1, 0.5)]], budget=2)
    with pytest.raises(ValueError, match="repeats"):
        build_best_first_tree([[(1, -1.0), (1, -2.0)]], budget=2)
    with pytest.raises(ValueError, match="budget"):
        build_best_first_tree([[(1, -1.0)]], budget=-1)


@settings(max_examples=200, deadline=None)
@given(candidates=candidate_lists(), budget=st.integers(0, 40))
def test_best_first_tree_is_the_top_budget_prefix_closed_paths(candidates, budget):
    tree = build_best_first_tree(candidates, budget)
    possible = all_path_scores(candidates)
    assert tree.num_nodes == min(budget, len(possible))
    assert all(parent < i for i, parent in enumerate(tree.parents))  # topological
    DraftTree(list(tree.tokens), list(tree.parents), list(tree.depths))  # passes validation

    scores = node_scores(tree, candidates)
    # The included scores are exactly the best `budget` of all possible paths (as a multiset).
    assert sorted(scores, reverse=True) == pytest.approx(sorted(possible, reverse=True)[: tree.num_nodes])
    # Every frontier node (excluded, parent included) scores no higher than any included node.
    worst_included = min(scores, default=math.inf)
    for parent in [ROOT, *range(tree.num_nodes)]:
        depth = 1 if parent == ROOT else tree.depths[parent] + 1
        if depth > len(candidates):
            continue
        base = 0.0 if parent == ROOT else scores[parent]
        for token, logprob in candidates[depth - 1]:
            if tree.child_with_token(parent, token) is None:
                assert base + logprob <= worst_included + 1e-12


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(st.integers(0, 9), max_size=8), budget=st.integers(0, 10))
def test_single_candidate_per_depth_always_gives_a_chain(tokens, budget):
    tree = build_best_first_tree([[(t, -1.0)] for t in tokens], budget)
    assert tree.is_chain
    assert tree.tokens == tokens[:budget]


def test_build_is_deterministic_under_ties():
    candidates = [[(1, -1.0), (2, -1.0)], [(3, -1.0), (4, -1.0)]]
    first = build_best_first_tree(candidates, budget=3)
    assert all(build_best_first_tree(candidates, budget=3) == first for _ in range(5))
    # Ties prefer shallower nodes: both depth-1 nodes before any depth-2 node.
    assert first.depths == [1, 1, 2]


def test_walk_descends_while_target_agrees_and_emits_a_bonus_token():
    #   root -> 0(5) -> 1(6)
    #        -> 0(5) -> 2(7) -> 3(8)
    tree = DraftTree([5, 6, 7, 8], [ROOT, 0, 0, 2], [1, 2, 2, 3])
    target = {ROOT: 5, 0: 7, 2: 8, 3: 42}
    asked = []

    def next_token_at(node: int) -> int:
        asked.append(node)
        return target[node]

    accepted, emitted = walk(tree, next_token_at)
    assert accepted == [0, 2, 3]
    assert emitted == [5, 7, 8, 42]
    assert asked == [ROOT, 0, 2, 3]  # lazily, only along the accepted path


def test_walk_rejecting_the_first_draft_still_emits_one_token():
    accepted, emitted = walk(DraftTree.chain([1, 2]), lambda node: 9)
    assert (accepted, emitted) == ([], [9])


@settings(max_examples=100, deadline=None)
@given(
    drafts=st.lists(st.integers(0, 3), max_size=6),
    plain=st.lists(st.integers(0, 3), min_size=7, max_size=7),
)
def test_greedy_walk_on_a_chain_matches_plain_decoding(drafts, plain):
    # The target "plain decodes" the sequence `plain`: after the root and i accepted nodes it says plain[i].
    tree = DraftTree.chain(drafts)
    accepted, emitted = walk(tree, lambda node: plain[len(tree.path_to(node)) if node != ROOT else 0])
    assert emitted == plain[: len(emitted)]
    num_agree = next((i for i, (d, p) in enumerate(zip(drafts, plain)) if d != p), len(drafts))
    assert len(accepted) == num_agree
    assert [tree.tokens[i] for i in accepted] == emitted[:-1]
