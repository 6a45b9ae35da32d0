"""Suffix drafts: frequency-scored trees, their depth from the match length, their scores."""

from __future__ import annotations

import pytest

from worker.drafters.suffix_proposal import draft_from
from worker.drafters.suffix_tree import SuffixTree
from worker.speculation.tree import ROOT

X, A, B, C, D, E = 10, 11, 12, 13, 14, 15


@pytest.fixture
def tree() -> SuffixTree:
    """The module docstring's: "x" followed by a 6 times, b 3 times, c once; "x a" by d always."""
    tree = SuffixTree(max_depth=8)
    outputs = [[X, A, D]] * 6 + [[X, B, E]] * 3 + [[X, C]]
    for key, tokens in enumerate(outputs):
        tree.add(key, tokens)
    return tree


def test_docstring_example(tree):
    proposal = draft_from(tree, [X], "global", max_nodes=3, spec_factor=10.0, min_prob=0.1)
    assert proposal is not None
    assert (proposal.tree.tokens, proposal.tree.parents) == ([A, D, B], [ROOT, 0, ROOT])
    assert proposal.score == pytest.approx(0.6 + 0.6 + 0.3)
    assert proposal.expected_tokens == pytest.approx(2.5)
    assert proposal.node_probs == pytest.approx([0.6, 0.6, 0.3])
    assert proposal.expected_tokens_within(1) == pytest.approx(1.6)  # the tree cut to its best node
    assert (proposal.match_length, proposal.source) == (1, "global")


def test_paths_below_min_prob_are_not_drafted(tree):
    proposal = draft_from(tree, [X], "global", max_nodes=10, spec_factor=10.0, min_prob=0.2)
    assert sorted(proposal.tree.tokens) == sorted([A, D, B, E])  # c (0.1) left out
    assert proposal.score == pytest.approx(0.6 + 0.6 + 0.3 + 0.3)


def test_draft_depth_grows_with_the_match_length(tree):
    short = draft_from(tree, [X], "global", max_nodes=10, spec_factor=1.0, min_prob=0.0)
    assert max(short.tree.depths) == 1 and sorted(short.tree.tokens) == sorted([A, B, C])
    long = draft_from(tree, [X, A], "global", max_nodes=10, spec_factor=1.0, min_prob=0.0)
    assert long.tree.tokens == [D] and long.match_length == 2  # the sequences end after d


def test_a_long_match_drafts_from_a_shorter_suffix_within_the_depth_bound():
    tree = SuffixTree(max_depth=6)
    tokens = list(range(20, 40))
    tree.add(0, tokens)
    # A 5-token match leaves 1 token below it in a depth-6 tree; 4 are wanted: drafted from its
    # last 2 tokens, which see 4 further.
    proposal = draft_from(tree, tokens[3:8], "global", max_nodes=4, spec_factor=1.0, min_prob=0.0)
    assert proposal.tree.tokens == tokens[8:12]
    assert proposal.tree.is_chain and proposal.score == pytest.approx(4.0)


def test_the_draft_follows_a_single_earlier_occurrence_to_its_end():
    tree = SuffixTree(max_depth=24)
    tree.add(0, [1, 2, 3, 4, 5, 6])
    proposal = draft_from(tree, [2, 3], "global", max_nodes=8, spec_factor=4.0, min_prob=0.0)
    assert proposal.tree.tokens == [4, 5, 6]  # read on along the leaf's occurrence


def test_nothing_to_draft():
    tree = SuffixTree(max_depth=4)
    tree.add(0, [1, 2])
    assert draft_from(tree, [2], "global", max_nodes=4, spec_factor=1.0, min_prob=0.0) is None
    assert draft_from(tree, [1], "global", max_nodes=4, spec_factor=0.5, min_prob=0.0) is None  # depth 0
