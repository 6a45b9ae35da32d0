"""The suffix tree against brute force: counts, continuations, windows, removal and the node bound."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.drafters.suffix_tree import SuffixTree

A, B, C, D = 1, 2, 3, 4


def brute_counts(sequences: list[list[int]], substring: list[int], max_depth: int) -> tuple[int, int, dict[int, int]]:
    """(count, continued, follower -> count) of `substring` over the sequences, by scanning."""
    count, followers = 0, {}
    n = len(substring)
    for tokens in sequences:
        for start in range(len(tokens) - n + 1):
            if tokens[start : start + n] == substring:
                count += 1
                if start + n < len(tokens) and n < max_depth:
                    follower = tokens[start + n]
                    followers[follower] = followers.get(follower, 0) + 1
    return count, sum(followers.values()), followers


def all_substrings(sequences: list[list[int]], max_depth: int) -> set[tuple[int, ...]]:
    return {
        tuple(tokens[start : start + n])
        for tokens in sequences
        for n in range(1, max_depth + 1)
        for start in range(len(tokens) - n + 1)
    }


def assert_matches_brute_force(tree: SuffixTree, sequences: list[list[int]], alphabet: range) -> None:
    present = all_substrings(sequences, tree.max_depth)
    for substring in present:
        position = tree.find(substring)
        assert position is not None, substring
        count, continued, followers = brute_counts(sequences, list(substring), tree.max_depth)
        assert (tree.count(position), tree.continued(position)) == (count, continued), substring
        shares = {token: share for token, _, share in tree.continuations(position)}
        assert shares == pytest.approx({token: n / continued for token, n in followers.items()}), substring
    # A few absent ones, one token past each present substring.
    for substring in list(present)[:50]:
        for token in alphabet:
            longer = substring + (token,)
            if len(longer) <= tree.max_depth and longer not in present:
                assert tree.find(longer) is None, longer
    assert tree.root.continued == sum(len(tokens) for tokens in sequences)


def test_docstring_example():
    tree = SuffixTree(max_depth=3)
    tree.extend("s", [A, B, A, B])
    assert [(node.depth, node.count) for node in tree.active("s")] == [(0, 0), (1, 2), (2, 2)]
    assert tree.count(tree.find([A, B])) == 2 and tree.continued(tree.find([A, B])) == 1
    assert tree.continuations(tree.find([A, B])) == [(A, tree.find([A, B, A]), 1.0)]
    assert tree.continued(tree.find([A, B, A])) == 0  # at the depth bound: nothing stored below
    assert tree.find([B, B]) is None


def test_unique_text_costs_about_one_node_a_token_and_keeps_no_long_active_list():
    rng = random.Random(0)
    tokens = rng.sample(range(10_000), 2_000)  # no token repeats
    tree = SuffixTree(max_depth=24)
    tree.extend(0, tokens)
    assert tree.num_nodes == len(tokens)
    assert len(tree.active(0)) == 1  # only the root: no suffix of the tail repeats


def test_periodic_text_counts_every_occurrence():
    tree = SuffixTree(max_depth=4)
    tree.extend(0, [A] * 10)
    for n in range(1, 5):
        position = tree.find([A] * n)
        assert tree.count(position) == 11 - n
        assert tree.continued(position) == (10 - n if n < 4 else 0)


@settings(max_examples=200, deadline=None)
@given(
    sequences=st.lists(st.lists(st.integers(0, 2), max_size=40), min_size=1, max_size=4),
    max_depth=st.integers(2, 6),
)
def test_counts_equal_brute_force(sequences, max_depth):
    tree = SuffixTree(max_depth=max_depth)
    for key, tokens in enumerate(sequences):
        for start in range(0, len(tokens), 7):  # in pieces, as committed tokens arrive
            tree.extend(key, tokens[start : start + 7])
    assert_matches_brute_force(tree, sequences, range(3))


@settings(max_examples=150, deadline=None)
@given(tokens=st.lists(st.integers(0, 2), max_size=80), max_depth=st.integers(2, 5), extra=st.integers(1, 12))
def test_a_window_keeps_exactly_its_last_tokens(tokens, max_depth, extra):
    max_history = max_depth + extra
    tree = SuffixTree(max_depth=max_depth, max_history=max_history)
    tree.extend(0, tokens)
    assert_matches_brute_force(tree, [tokens[-max_history:]] if tokens else [], range(3))


@settings(max_examples=100, deadline=None)
@given(sequences=st.lists(st.lists(st.integers(0, 2), max_size=30), min_size=2, max_size=5), data=st.data())
def test_removing_sequences_leaves_the_others_and_finally_nothing(sequences, data):
    tree = SuffixTree(max_depth=4)
    for key, tokens in enumerate(sequences):
        tree.add(key, tokens)
    removed = data.draw(st.sets(st.integers(0, len(sequences) - 1)))
    for key in removed:
        tree.remove(key)
    kept = [tokens for key, tokens in enumerate(sequences) if key not in removed]
    assert_matches_brute_force(tree, kept, range(3))
    for key in range(len(sequences)):
        tree.remove(key)
    assert tree.num_nodes == 0 and tree.root.continued == 0 and not tree.root.children


def test_adding_a_sequence_again_replaces_it():
    tree = SuffixTree(max_depth=4)
    tree.add("r", [A, B, C])
    tree.add("r", [A, B, D])
    assert tree.find([B, C]) is None
    assert tree.count(tree.find([A, B])) == 1


def test_the_oldest_sequences_are_dropped_to_fit_the_node_bound():
    rng = random.Random(1)
    outputs = [[rng.randrange(1000) for _ in range(50)] for _ in range(10)]
    tree = SuffixTree(max_depth=8, max_nodes=200)
    for key, tokens in enumerate(outputs):
        tree.add(key, tokens)
        assert tree.num_nodes <= 200
    assert 9 in tree and 0 not in tree
    kept = [key for key in range(10) if key in tree]
    assert kept == list(range(10 - len(kept), 10))  # the newest, oldest gone first
    assert_matches_brute_force(tree, [outputs[key] for key in kept], range(0))


def test_a_sequence_larger_than_the_bound_is_kept_alone():
    tree = SuffixTree(max_depth=4, max_nodes=5)
    tree.add("old", [A, B])
    tree.add("new", list(range(10, 30)))
    assert "new" in tree and "old" not in tree


def test_memory_stays_bounded_under_a_window():
    rng = random.Random(2)
    tree = SuffixTree(max_depth=8, max_history=64)
    for _ in range(50):
        tree.extend(0, [rng.randrange(4) for _ in range(100)])
        assert tree.num_nodes <= 64 * 8
        assert len(tree._sequences[0].tokens) <= 2 * 64 + 1


@pytest.mark.parametrize("kwargs", [{"max_depth": 1}, {"max_depth": 4, "max_history": 4}])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        SuffixTree(**kwargs)
