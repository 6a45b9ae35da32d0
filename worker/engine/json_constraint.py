"""JSON mode on the target's logits: a boolean mask per row, from the JSON state its history reaches.

`JsonMasks` is per model: the vocabulary index (built on first use: ~0.6 s for 49k tokens) and a
bounded cache of masks by `JsonVocabulary.cache_key`. A long answer revisits a handful of keys
(inside a value string three objects deep, after a number in an array, ...), so most steps cost
a dict lookup. `JsonConstraint` is per sequence: the JSON state after each committed output
token, so a step feeds only what it has not seen (the tokens of one draft path at most).

The mask is applied before everything else in `process_logits` (as vLLM applies its grammar
bitmask before sampling), and the verifier computes it row by row from each row's own history,
so drafted tokens that break JSON are rejected like any other disagreement: every speculation
mode stays lossless. Once the top-level object closes, only the sequence's stop ids may follow
(the model's EOS if it has none, e.g. with ignore_eos): the answer ends there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

from worker.constraints.json_grammar import INITIAL, State, feed, is_complete
from worker.constraints.json_vocabulary import JsonVocabulary, byte_level_token_bytes

if TYPE_CHECKING:
    from worker.models.loader import LoadedModel

MAX_CACHED_MASKS = 256  # of vocab_size bools each: 12 MB for a 49k vocabulary


class JsonMasks:
    def __init__(
        self,
        token_bytes: Callable[[], list[bytes | None]],
        vocab_size: int,
        eos_ids: Collection[int],
        device: torch.device | str = "cpu",
    ):
        self._token_bytes_source = token_bytes
        self._vocab_size = vocab_size  # the logits' width: the model's, which may exceed the tokenizer's
        self._device = device  # the logits': a cached mask is not copied to the GPU at every step
        self._eos_ids = frozenset(eos_ids)
        self._lock = threading.Lock()  # built by whichever thread asks first
        self._vocabulary: JsonVocabulary | None = None
        self.token_bytes: list[bytes | None] = []
        self._masks: OrderedDict[State, torch.Tensor] = OrderedDict()

    @classmethod
    def for_model(cls, model: LoadedModel) -> JsonMasks:
        """The masks of a loaded model: its tokenizer's bytes, its logits' width, EOS and device."""
        return cls(
            partial(byte_level_token_bytes, model.tokenizer),
            model.config.vocab_size,
            model.checkpoint.eos_token_ids,
            model.decoder.device,
        )

    @property
    def prepared(self) -> bool:
        return self._vocabulary is not None

    def prepare(self) -> None:
        """Build the index now (the worker does, off the owner thread, before a JSON request runs);
        raises UnsupportedVocabulary where the tokenizer gives no token bytes."""
        if self._vocabulary is not None:  # the common case, on every masked row: no lock
            return
        with self._lock:
            if self._vocabulary is None:
                self.token_bytes = self._token_bytes_source()
                self._vocabulary = JsonVocabulary(self.token_bytes)

    def mask(self, state: State | None, stop_ids: Collection[int]) -> torch.Tensor:  # [vocab_size] bool
        if state is None or is_complete(state):
            return self._ids_mask(stop_ids or self._eos_ids)
        self.prepare()
        assert self._vocabulary is not None
        key = self._vocabulary.cache_key(state)
        cached = self._masks.get(key)
        if cached is None:
            cached = self._masks[key] = self._ids_mask(self._vocabulary.allowed_ids(state))
            if len(self._masks) > MAX_CACHED_MASKS:
                self._masks.popitem(last=False)
        else:
            self._masks.move_to_end(key)
        return cached

    def _ids_mask(self, token_ids: Collection[int]) -> torch.Tensor:
        mask = torch.zeros(self._vocab_size, dtype=torch.bool)
        mask[torch.tensor(sorted(token_ids), dtype=torch.long)] = True
        return mask.to(self._device)


class JsonConstraint:
    """One sequence's JSON progress; `mask(history)` for a row whose history is the committed
    output plus (maybe) a draft path."""

    def __init__(self, masks: JsonMasks, stop_ids: Collection[int]):
        self._masks = masks
        self._stop_ids = stop_ids
        self._states: list[State | None] = [INITIAL]  # _states[k]: after the first k committed tokens

    def mask(self, history: Sequence[int], num_committed: int) -> torch.Tensor:  # [vocab_size] bool
        self._masks.prepare()
        token_bytes = self._masks.token_bytes
        while len(self._states) <= num_committed:
            self._states.append(_feed_token(self._states[-1], token_bytes, history[len(self._states) - 1]))
        state = self._states[num_committed]
        for token_id in history[num_committed:]:
            state = _feed_token(state, token_bytes, token_id)
        return self._masks.mask(state, self._stop_ids)


def _feed_token(state: State | None, token_bytes: list[bytes | None], token_id: int) -> State | None:
    data = token_bytes[token_id] if 0 <= token_id < len(token_bytes) else None
    return None if state is None or data is None else feed(state, data)
