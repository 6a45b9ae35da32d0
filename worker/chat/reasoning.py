"""Streaming split of model output into reasoning text (between think tags) and content.

The output has at most one reasoning section: content, then `<think>`, reasoning, `</think>`,
then content to the end. A second `<think>` after the section closed is literal content, so a
model cannot reopen reasoning once the worker's reasoning budget forced it shut.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(slots=True)
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class _Phase(enum.Enum):
    BEFORE = "before"  # content, watching for the start tag
    REASONING = "reasoning"  # watching for the end tag
    AFTER = "after"  # content, verbatim


# Tags split across chunks, by example (end tag "</think>"):
#   feed("abc</th")  -> reasoning "abc"; "</th" is held, since it may begin the tag
#   feed("ink>xyz")  -> the buffer "</think>xyz" holds the tag: content "xyz"
# Had the second chunk been "ought", "</thought" is no tag prefix and goes out as reasoning.
# Whatever the chunking, a character is emitted once the parser knows which side it is on, so
# any split of the same text yields the same concatenated reasoning and content.


class ReasoningParser:
    def __init__(self, start_tag: str = "<think>", end_tag: str = "</think>", starts_in_reasoning: bool = False):
        if not start_tag or not end_tag:
            raise ValueError(f"tags must be non-empty, got start_tag={start_tag!r}, end_tag={end_tag!r}")
        self.start_tag = start_tag
        self.end_tag = end_tag
        self._phase = _Phase.REASONING if starts_in_reasoning else _Phase.BEFORE
        self._buffer = ""  # received, not yet emitted: a possible tag prefix
        # A tag to drop if the text continues with it (after optional whitespace): the start tag
        # when the prompt already opened reasoning (some models repeat it), the end tag after
        # force_end (the worker appends the tag's tokens, whose text comes back through feed).
        self._optional_tag = start_tag if starts_in_reasoning else ""
        self._carry = ReasoningDelta()  # held text that force_end settled, emitted with the next delta

    @property
    def in_reasoning(self) -> bool:
        return self._phase is _Phase.REASONING

    def feed(self, text: str) -> ReasoningDelta:
        self._buffer += text
        delta, self._carry = self._carry, ReasoningDelta()
        while self._step(delta):
            pass
        return delta

    def flush(self) -> ReasoningDelta:
        """End of output: held text was not a tag after all; emit it on the current side."""
        delta = self.feed("")
        self._emit(delta, self._buffer)
        self._buffer = ""
        self._optional_tag = ""
        return delta

    def force_end(self) -> None:
        """Close reasoning now (budget spent); later text is content, a leading end tag is dropped."""
        if self._phase is not _Phase.REASONING:
            return
        self._carry.reasoning += self._buffer
        self._buffer = ""
        self._phase = _Phase.AFTER
        self._optional_tag = self.end_tag

    def _step(self, delta: ReasoningDelta) -> bool:
        """Consume what the buffer allows; True if the phase changed and the rest needs another look."""
        if self._optional_tag and not self._drop_optional_tag():
            return False
        if self._phase is _Phase.AFTER:
            self._emit(delta, self._buffer)
            self._buffer = ""
            return False
        tag = self.start_tag if self._phase is _Phase.BEFORE else self.end_tag
        before, found = _split_at(self._buffer, tag)
        self._emit(delta, before)
        self._buffer = self._buffer[len(before) + (len(tag) if found else 0) :]
        if found:
            self._phase = _Phase.REASONING if self._phase is _Phase.BEFORE else _Phase.AFTER
        return found

    def _drop_optional_tag(self) -> bool:
        """False while the buffer could still grow into the optional tag; then drop it if present.

        Leading whitespace goes with the tag: a forced close is often written as "\n</think>".
        """
        tag = self._optional_tag
        stripped = self._buffer.lstrip()
        if len(stripped) < len(tag) and tag.startswith(stripped):
            return False
        if stripped.startswith(tag):
            self._buffer = stripped[len(tag) :]
        self._optional_tag = ""
        return True

    def _emit(self, delta: ReasoningDelta, text: str) -> None:
        if self._phase is _Phase.REASONING:
            delta.reasoning += text
        else:
            delta.content += text


def _split_at(buffer: str, tag: str) -> tuple[str, bool]:
    """(text that is safe to emit before the tag, whether the tag itself is there)."""
    i = buffer.find(tag)
    if i >= 0:
        return buffer[:i], True
    return buffer[: len(buffer) - _held_len(buffer, tag)], False


def _held_len(buffer: str, tag: str) -> int:
    """Length of the longest buffer suffix that is a proper prefix of tag."""
    for n in range(min(len(buffer), len(tag) - 1), 0, -1):
        if buffer.endswith(tag[:n]):
            return n
    return 0
