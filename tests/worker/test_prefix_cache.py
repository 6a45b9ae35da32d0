"""Prefix cache bookkeeping: hash chains, longest-prefix lookup, LRU under a byte budget. No torch."""

from __future__ import annotations

import pytest

from worker.serving.prefix_cache import PrefixCache, block_hashes

B = 4  # tokens per block in these tests


def tokens(*blocks: int) -> list[int]:
    """One block of four tokens per argument, each block's tokens derived from its number."""
    return [block * 10 + i for block in blocks for i in range(B)]


def test_hash_chain_depends_on_the_whole_prefix():
    a = block_hashes(tokens(1, 2, 3), B)
    b = block_hashes(tokens(1, 2, 4), B)
    c = block_hashes(tokens(9, 2, 3), B)
    assert len(a) == 3 and a[:2] == b[:2] and a[2] != b[2]
    assert all(x != y for x, y in zip(a, c))  # a different first block changes every later key
    assert block_hashes(tokens(1, 2) + [7, 7], B) == a[:2]  # a partial last block is ignored


def test_lookup_finds_the_longest_shared_block_prefix():
    cache = PrefixCache(max_bytes=1000, block_tokens=B)
    assert cache.insert(tokens(1, 2, 3, 4), target="kv-1234", drafter="d-1234", num_bytes=10)
    hit = cache.lookup(tokens(1, 2, 7, 8), max_tokens=15)
    assert (hit.num_tokens, hit.entry_tokens, hit.target, hit.drafter) == (8, 16, "kv-1234", "d-1234")
    assert cache.lookup(tokens(5, 2, 3, 4), max_tokens=15) is None
    assert (cache.stats.queries, cache.stats.hits, cache.stats.hit_tokens) == (2, 1, 8)


def test_lookup_never_covers_more_than_max_tokens():
    cache = PrefixCache(max_bytes=1000, block_tokens=B)
    cache.insert(tokens(1, 2, 3), "kv", None, 10)
    # 12 tokens, all cached; the last one must still be computed (the cache holds all but the root)
    assert cache.lookup(tokens(1, 2, 3), max_tokens=11).num_tokens == 8
    assert cache.lookup(tokens(1, 2, 3), max_tokens=3) is None


def test_least_recently_used_entry_is_evicted_first():
    cache = PrefixCache(max_bytes=25, block_tokens=B)
    cache.insert(tokens(1), "kv1", None, 10)
    cache.insert(tokens(2), "kv2", None, 10)
    cache.lookup(tokens(1), max_tokens=100)  # 1 is now more recent than 2
    cache.insert(tokens(3), "kv3", None, 10)
    assert cache.lookup(tokens(2), max_tokens=100) is None
    assert cache.lookup(tokens(1), max_tokens=100).target == "kv1"
    assert cache.num_bytes == 20 and cache.stats.evictions == 1


def test_an_entry_that_extends_another_replaces_it():
    cache = PrefixCache(max_bytes=1000, block_tokens=B)
    cache.insert(tokens(1, 2), "short", None, 10)
    cache.insert(tokens(1, 2, 3), "long", None, 15)
    assert cache.num_entries == 1 and cache.num_bytes == 15
    assert cache.lookup(tokens(1, 2), max_tokens=100).target == "long"
    assert not cache.insert(tokens(1, 2), "again", None, 10)  # covered: nothing stored
    assert cache.covers(tokens(1, 2, 3)) and not cache.covers(tokens(1, 2, 3, 4))


def test_sibling_prefixes_are_both_kept_and_share_their_common_part():
    cache = PrefixCache(max_bytes=1000, block_tokens=B)
    cache.insert(tokens(1, 2, 3), "a", None, 10)
    cache.insert(tokens(1, 2, 4), "b", None, 10)
    assert cache.num_entries == 2
    assert cache.lookup(tokens(1, 2, 3), max_tokens=100).target == "a"
    assert cache.lookup(tokens(1, 2, 4), max_tokens=100).target == "b"
    assert cache.lookup(tokens(1, 2, 9), max_tokens=100).num_tokens == 8
    cache.clear()
    assert cache.num_bytes == 0 and cache.lookup(tokens(1, 2), max_tokens=100) is None


def test_an_entry_larger_than_the_budget_is_not_stored():
    cache = PrefixCache(max_bytes=10, block_tokens=B)
    cache.insert(tokens(1), "kv1", None, 5)
    assert not cache.insert(tokens(2), "huge", None, 11)
    assert cache.lookup(tokens(1), max_tokens=100).target == "kv1"  # nothing was evicted for it


def test_insert_requires_whole_blocks():
    cache = PrefixCache(max_bytes=10, block_tokens=B)
    with pytest.raises(AssertionError):
        cache.insert(tokens(1) + [5], "kv", None, 1)


def test_every_entry_that_leaves_is_handed_to_on_drop():
    dropped: list[str] = []
    cache = PrefixCache(max_bytes=25, block_tokens=B, on_drop=lambda entry: dropped.append(entry.target))
    cache.insert(tokens(1), "kv1", None, 10)
    cache.insert(tokens(1, 2), "kv12", None, 10)  # supersedes kv1
    cache.insert(tokens(3), "kv3", None, 10)
    cache.insert(tokens(4), "kv4", None, 10)  # over budget: the oldest, kv12, goes
    assert dropped == ["kv1", "kv12"]
    assert cache.evict_oldest() and dropped[-1] == "kv3" and cache.stats.evictions == 2
    cache.clear()
    assert dropped == ["kv1", "kv12", "kv3", "kv4"] and cache.num_bytes == 0
    assert not cache.evict_oldest()
