"""Speculation counts by draft source: the tree names its source, the stats and the worker count it."""

from __future__ import annotations

from worker.engine.stats import SourceCounts, SpecStats, add_to_source
from worker.speculation.tree import DraftTree


def test_each_step_counts_under_its_source_and_a_step_without_a_draft_nowhere():
    stats = SpecStats()
    stats.record_step(3, 2, 3, "mtp")
    stats.record_step(0, 0, 1, "mtp")
    assert stats.last_source == ""
    stats.record_step(4, 4, 5, "suffix")
    assert stats.last_source == "suffix"
    stats.record_step(2, 0, 1, "mtp")
    assert stats.by_source == {"mtp": SourceCounts(2, 5, 2), "suffix": SourceCounts(1, 4, 4)}
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (3, 9, 6), "the sources sum to the totals"
    assert stats.to_dict()["draft_sources"]["suffix"] == {"drafts": 1, "draft_tokens": 4, "accepted_tokens": 4}


def test_merged_stats_add_their_sources():
    first, second = SpecStats(), SpecStats()
    first.record_step(2, 1, 2, "mtp")
    second.record_step(2, 2, 3, "mtp")
    second.record_step(1, 1, 2, "grammar")
    first.merge(second)
    assert first.by_source == {"mtp": SourceCounts(2, 4, 3), "grammar": SourceCounts(1, 1, 1)}


def test_a_worker_counter_takes_a_steps_difference_under_the_steps_source():
    by_source: dict[str, SourceCounts] = {}
    add_to_source(by_source, "ngram", 1, 3, 2)
    add_to_source(by_source, "ngram", 0, 0, 0)
    add_to_source(by_source, "ngram", 1, 2, 0)
    assert by_source == {"ngram": SourceCounts(2, 5, 2)}


def test_a_truncated_tree_keeps_its_source():
    tree = DraftTree.chain([5, 6, 7], source="suffix")
    assert tree.truncated(2).source == "suffix" and tree.truncated(2).tokens == [5, 6]
    assert DraftTree.chain([5]).source == "", "the worker's drafter, by default"
