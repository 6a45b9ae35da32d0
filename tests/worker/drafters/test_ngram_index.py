import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.drafters.ngram_index import NgramIndex


def reference_propose(history, min_n, max_n, num_draft, max_history):
    """Brute force: scan the window for the latest earlier occurrence of the longest suffix."""
    window = list(history[-max_history:])
    for n in range(max_n, min_n - 1, -1):
        if len(window) <= n:
            continue
        suffix = window[-n:]
        for start in range(len(window) - n - 1, -1, -1):
            if window[start : start + n] == suffix:
                return window[start + n : start + n + num_draft]
    return []


def test_docstring_example():
    drafter = NgramIndex(min_n=2, max_n=3, num_draft=3)
    a, b, c, d = 1, 2, 3, 4
    assert drafter.propose([a, b, c, d, a, b]) == [c, d, a]


def test_longest_suffix_wins_over_a_more_recent_shorter_match():
    drafter = NgramIndex(min_n=1, max_n=3, num_draft=2)
    #            x  y  z  P  Q  .  y  z  R  .  x  y  z
    history = [9, 1, 2, 50, 51, 0, 1, 2, 60, 0, 9, 1, 2]
    # "1 2" last occurred before 60, but "9 1 2" occurred before 50 51.
    assert drafter.propose(history) == [50, 51]


def test_most_recent_occurrence_is_used():
    drafter = NgramIndex(min_n=2, max_n=2, num_draft=1)
    assert drafter.propose([1, 2, 7, 1, 2, 8, 1, 2]) == [8]


def test_no_match_proposes_nothing():
    drafter = NgramIndex()
    assert drafter.propose([]) == []
    assert drafter.propose([1, 2, 3, 4, 5]) == []


def test_draft_may_run_into_the_suffix_itself():
    # A repeating pattern: the continuation of the previous "1 1" overlaps the current suffix.
    assert NgramIndex(min_n=2, max_n=2, num_draft=3).propose([1, 1, 1]) == [1]


def test_evicted_tokens_are_not_matched_and_memory_stays_bounded():
    drafter = NgramIndex(min_n=2, max_n=3, num_draft=2, max_history=8)
    drafter.extend([1, 2, 3])
    drafter.extend(range(100, 200))  # unique tokens push 1 2 3 out of the window
    drafter.extend([1, 2])
    assert drafter.draft() == []
    # Each of the 8 window positions starts at most one 2-gram and one 3-gram.
    assert drafter.num_indexed <= 2 * 8
    assert len(drafter._tokens) <= 2 * 8


def test_diverging_history_rebuilds_the_index():
    drafter = NgramIndex(min_n=2, max_n=2, num_draft=1)
    assert drafter.propose([1, 2, 3, 1, 2]) == [3]
    assert drafter.propose([5, 6, 7, 5, 6]) == [7]  # a different request's history
    assert drafter.propose([5, 6]) == []


@pytest.mark.parametrize("kwargs", [{"min_n": 0}, {"min_n": 3, "max_n": 2}, {"num_draft": 0}, {"max_history": 4}])
def test_invalid_settings_are_rejected(kwargs):
    with pytest.raises(ValueError):
        NgramIndex(**kwargs)


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(st.integers(0, 3), max_size=80),
    cuts=st.lists(st.integers(0, 80), max_size=8),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
    num_draft=st.integers(1, 4),
    max_history=st.integers(6, 20),
)
def test_incremental_index_matches_brute_force(history, cuts, min_n, extra_n, num_draft, max_history):
    max_n = min_n + extra_n
    drafter = NgramIndex(min_n, max_n, num_draft, max_history)
    for end in sorted({*cuts, len(history)}):
        prefix = history[: min(end, len(history))]
        expected = reference_propose(prefix, min_n, max_n, num_draft, max_history)
        assert drafter.propose(prefix) == expected
    assert drafter.num_indexed <= (max_n - min_n + 1) * max_history
