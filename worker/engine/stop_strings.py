"""Stop strings over streamed text: emit what is safe now, hold back what might start a stop string.

A stop string can arrive split over several chunks ("</an" + "swer>"), so the matcher holds back the
longest tail of the text that is a proper prefix of some stop string, and emits the rest. The
first stop string to *complete* ends the text, cut before it; when several complete at the same
character, the one that started first (the longest) wins. Generation stops the moment a stop
string appears, so a longer one that would have completed later never gets the chance.

Example, stop ["</answer>"]: feed("42</an") -> ("42", False) holding "</an";
feed("swer> junk") -> ("", True); the output is "42" ("42</answer>" with `include_stop`).
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    def __init__(self, stop: Sequence[str], include_stop: bool = False) -> None:
        for index, text in enumerate(stop):
            if not text:
                raise ValueError(f"stop[{index}]={text!r} must not be empty")
        self._stops = tuple(dict.fromkeys(stop))  # deduplicated, order kept
        # Every proper prefix of every stop string: the tails worth holding back.
        self._prefixes = frozenset(text[:end] for text in self._stops for end in range(1, len(text)))
        self._max_held = max((len(text) - 1 for text in self._stops), default=0)
        self._held = ""
        self._include_stop = include_stop  # vLLM's include_stop_str_in_output: cut after it, not before
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text

    def feed(self, text: str) -> tuple[str, bool]:
        """Text safe to emit now, and whether a stop string was hit (text after it is dropped)."""
        if self.stopped:
            return "", True
        buffer = self._held + text
        found = self._first_completed_stop(buffer)
        if found is not None:
            self._held, self.stopped = "", True
            start, end = found
            self.matched = buffer[start:end]
            return buffer[: end if self._include_stop else start], True
        num_held = self._num_to_hold(buffer)
        self._held = buffer[len(buffer) - num_held :]
        return buffer[: len(buffer) - num_held], False

    def flush(self) -> str:
        """At the end of generation: what was held back, since no stop string completed."""
        held, self._held = self._held, ""
        return held

    def _first_completed_stop(self, buffer: str) -> tuple[int, int] | None:
        """(start, end) of the stop string that ends first in `buffer` (earliest start on a tie)."""
        best: tuple[int, int] | None = None  # (end, start)
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0 and (best is None or (start + len(stop), start) < best):
                best = (start + len(stop), start)
        return None if best is None else (best[1], best[0])

    def _num_to_hold(self, buffer: str) -> int:
        for length in range(min(self._max_held, len(buffer)), 0, -1):
            if buffer[len(buffer) - length :] in self._prefixes:
                return length
        return 0
