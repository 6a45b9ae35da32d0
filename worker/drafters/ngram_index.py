"""Prompt-lookup drafting: guess the next tokens by finding the current suffix earlier in the request.

Torch-free and incremental: one `NgramIndex` per lane keeps an index from every n-gram in the
last `max_history` tokens to its most recent position, updated as committed tokens arrive, so a
proposal costs O(max_n - min_n) dict lookups however long the request is.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The index, by example (min_n=2, max_n=3, history a b c d a b):
#
#   An n-gram is indexed only once the token after it is known, so the suffix never finds
#   itself. After "a b c d a b" the index holds (a b)->2, (b c)->3, (c d)->4, (d a)->5,
#   (a b c)->3, (b c d)->4, (c d a)->5, each value being the position right after the n-gram.
#   propose: the 3-gram suffix (d a b) is not indexed; the 2-gram suffix (a b) maps to 2, so the
#   draft is history[2:2+num_draft] = c d a. A later occurrence of (a b) overwrites the entry,
#   which is what makes the lookup return the most recent one.
#
# Eviction keeps memory bounded: when position q leaves the window of the last max_history
# tokens, every n-gram starting at q is dropped from the index unless a later occurrence has
# already replaced it. Since the index holds only the latest occurrence, a dropped key has no
# other occurrence left in the window either.


class NgramIndex:
    def __init__(self, min_n: int = 2, max_n: int = 4, num_draft: int = 3, max_history: int = 8192):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        if num_draft < 1:
            raise ValueError(f"num_draft={num_draft} must be >= 1")
        if max_history <= max_n:
            raise ValueError(f"max_history={max_history} must exceed max_n={max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self.num_draft = num_draft
        self.max_history = max_history
        self.reset()

    def reset(self) -> None:
        self._reset(num_seen=0)

    def _reset(self, num_seen: int) -> None:
        # The next extend() continues at absolute position `num_seen` (tokens before it are gone).
        self._tokens: list[int] = []  # a tail of the history; _tokens[0] is at position _base
        self._base = num_seen
        self._index: dict[tuple[int, ...], int] = {}  # n-gram -> position right after its latest occurrence

    @property
    def num_seen(self) -> int:
        """Tokens consumed so far (history length), including ones already evicted."""
        return self._base + len(self._tokens)

    @property
    def num_indexed(self) -> int:
        return len(self._index)

    def prefix(self, num_tokens: int) -> NgramIndex | None:
        """A new drafter that has seen exactly the first `num_tokens` tokens of this one's history.

        None when the window those tokens need has already been evicted from this drafter.
        """
        assert 0 <= num_tokens <= self.num_seen, (num_tokens, self.num_seen)
        first = max(0, num_tokens - self.max_history)
        if first < self._base:
            return None
        copy = NgramIndex(self.min_n, self.max_n, self.num_draft, self.max_history)
        copy._reset(num_seen=first)
        copy.extend(self._tokens[first - self._base : num_tokens - self._base])
        return copy

    def extend(self, new_tokens: Iterable[int]) -> None:
        for token in new_tokens:
            self._append(token)

    def propose(self, history: Sequence[int]) -> list[int]:
        """Draft tokens to follow `history`; a history that does not extend the last one is re-indexed."""
        self._sync(history)
        return self.draft()

    def draft(self) -> list[int]:
        """Up to num_draft tokens that followed the latest earlier occurrence of the longest suffix."""
        window_len = min(self.num_seen, self.max_history)
        for n in range(min(self.max_n, window_len - 1), self.min_n - 1, -1):
            after = self._index.get(tuple(self._tokens[-n:]))
            if after is not None:
                start = after - self._base
                return self._tokens[start : start + self.num_draft]
        return []

    def _sync(self, history: Sequence[int]) -> None:
        # A lane's committed tokens only grow, so normally only the new tail is indexed. Anything
        # else (a shorter history or a different last token) means a different sequence: rebuild.
        seen = self.num_seen
        if len(history) >= seen and (seen == 0 or history[seen - 1] == self._tokens[-1]):
            self.extend(history[seen:])
            return
        tail = history[max(0, len(history) - self.max_history) :]
        self._reset(num_seen=len(history) - len(tail))
        self.extend(tail)

    def _append(self, token: int) -> None:
        self._tokens.append(token)
        position = self.num_seen - 1
        window_start = max(0, position + 1 - self.max_history)
        self._index_ngrams_ending_before(position, window_start)
        if window_start > 0:
            self._evict(window_start - 1)
        self._compact(window_start)

    def _index_ngrams_ending_before(self, position: int, window_start: int) -> None:
        # The n-grams ending at position-1 now have a known follower: the token at `position`.
        for n in range(self.min_n, self.max_n + 1):
            start = position - n
            if start < window_start:
                break
            local = start - self._base
            self._index[tuple(self._tokens[local : local + n])] = position

    def _evict(self, start: int) -> None:
        for n in range(self.min_n, self.max_n + 1):
            local = start - self._base
            key = tuple(self._tokens[local : local + n])
            if self._index.get(key) == start + n:
                del self._index[key]

    def _compact(self, window_start: int) -> None:
        # Drop evicted tokens in bulk so that appending stays amortized O(max_n).
        num_stale = window_start - self._base
        if num_stale >= self.max_history:
            del self._tokens[:num_stale]
            self._base = window_start
