"""A tree's worth from acceptance by depth and rank, on fixed numbers (torch-free)."""

from __future__ import annotations

import pytest

from worker.speculation.acceptance import expected_tokens
from worker.speculation.rank_acceptance import RankAcceptance, expected_tree_tokens, tree_expectations
from worker.speculation.tree import ROOT, DraftTree


def fixed(rates: dict[tuple[int, int], float], default: float = 0.0):
    return lambda depth, rank: rates.get((depth, rank), default)


def test_the_worked_example_a_runner_up_beats_a_second_depth():
    rate = fixed({(1, 0): 0.4, (1, 1): 0.5, (2, 0): 0.5})
    chain = DraftTree.chain([10, 11])
    siblings = DraftTree([10, 12], [ROOT, ROOT], [1, 1])
    assert expected_tree_tokens(chain, rate) == pytest.approx(1.6)
    assert expected_tree_tokens(siblings, rate) == pytest.approx(1.7)


def test_a_chain_is_worth_what_the_chain_formula_says():
    rates = [0.7, 0.5, 0.3, 0.2]
    rate = fixed({(d + 1, 0): p for d, p in enumerate(rates)})
    for k in range(1, 5):
        assert expected_tree_tokens(DraftTree.chain(list(range(k))), rate) == pytest.approx(expected_tokens(rates, k))


def test_best_first_expectations_on_fixed_rates():
    # q(d, 0) = 0.6 and q(d, 1) = 0.3 at every depth, at most 3 deep, 2 children a node. Node
    # probabilities: depth 1 first choice 0.6, its first child 0.36, then 0.216 (depth 3); the
    # depth-1 runner-up 0.4 * 0.3 = 0.12; then the runner-up under the first choice 0.6 * 0.4 * 0.3 = 0.072.
    rate = fixed({(d, 0): 0.6 for d in (1, 2, 3)} | {(d, 1): 0.3 for d in (1, 2, 3)})
    got = tree_expectations(rate, budget=5, max_depth=3, max_rank=2)
    assert got == pytest.approx([1.0, 1.6, 1.96, 2.176, 2.296, 2.368])
    tree = DraftTree([1, 2, 3, 4, 5], [ROOT, 0, 1, ROOT, 0], [1, 2, 3, 1, 2])  # those five nodes
    assert expected_tree_tokens(tree, rate) == pytest.approx(got[5])


def test_expectations_stop_growing_when_the_shape_is_exhausted():
    got = tree_expectations(fixed({(1, 0): 0.5, (1, 1): 0.5}), budget=4, max_depth=1, max_rank=2)
    assert got == pytest.approx([1.0, 1.5, 1.75, 1.75, 1.75])


def test_walks_are_counted_by_depth_and_rank():
    # a(0) and b(1) under the root, c(2) under a
    tree = DraftTree([10, 11, 12], [ROOT, ROOT, 0], [1, 1, 2])
    acceptance = RankAcceptance(decay=1.0, prior_weight=0.0)
    acceptance.record(tree, [1])  # a refused, b accepted; b has no children: the walk ends there
    acceptance.record(tree, [0, 2])  # a, then c accepted; c has no children
    acceptance.record(tree, [])  # a and b refused
    assert acceptance.attempts == {(1, 0): 3.0, (1, 1): 2.0, (2, 0): 1.0}
    assert acceptance.accepted == {(1, 1): 1.0, (1, 0): 1.0, (2, 0): 1.0}
    assert acceptance.rate(1, 0, prior=0.9) == pytest.approx(1 / 3)
    assert acceptance.rate(1, 1, prior=0.9) == pytest.approx(1 / 2)
    assert acceptance.rate(3, 0, prior=0.25) == pytest.approx(0.25)  # never reached: the prior
    assert acceptance.chain_rates(2, prior=0.5) == pytest.approx([1 / 3, 1.0])


def test_a_lanes_recent_walks_weigh_most():
    tree = DraftTree.chain([10])
    acceptance = RankAcceptance(decay=0.5, prior_weight=0.0)
    for _ in range(5):
        acceptance.record(tree, [])
    acceptance.record(tree, [0])
    assert acceptance.rate(1, 0, prior=0.5) > 0.5  # one recent acceptance outweighs five old refusals
