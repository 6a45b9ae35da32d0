"""Token ids -> text deltas for one sequence: incremental detokenization, then stop strings."""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

from worker.engine.detokenizer import IncrementalDetokenizer
from worker.engine.stop_strings import StopStringMatcher


class TextOutput:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        stop: Sequence[str],
        prompt_ids: Sequence[int] = (),
        include_stop: bool = False,
        min_tokens: int = 0,
    ):
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopStringMatcher(stop, include_stop)
        self._unchecked_tokens = min_tokens  # vLLM's min_tokens: stop strings count only after these
        self._num_tokens = 0
        self.stopped = False  # a stop string was hit: the caller finishes the sequence

    def add(self, token_ids: Sequence[int]) -> str:
        """New text safe to show; text after a stop string is never returned."""
        if self.stopped:
            return ""
        text = self._detokenizer.push(token_ids)
        self._num_tokens += len(token_ids)
        if self._num_tokens <= self._unchecked_tokens:
            return text  # within min_tokens: no stop string can end it yet
        text, self.stopped = self._stops.feed(text)
        return text

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the text, if one did."""
        return self._stops.matched

    def finish(self) -> str:
        """What was held back (an unfinished UTF-8 sequence or a possible stop-string prefix)."""
        if self.stopped:
            return ""
        text, self.stopped = self._stops.feed(self._detokenizer.flush())
        return text if self.stopped else text + self._stops.flush()
