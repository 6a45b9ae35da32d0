"""Structured outputs on the target's logits: a boolean mask per row, from llguidance's matcher.

`GrammarMasks` is per model: the llguidance tokenizer (built on first use from the model's own
`tokenizer.json` text, ~0.25 s for 49k tokens) and the compiled grammars, cached by grammar text
so a schema compiles once per worker (`compile` runs in the intake's thread, off the owner).
`GrammarConstraint` is per sequence: a matcher that has consumed the committed output. A row's
mask comes from its own history: the committed tokens, then (for a draft row) its draft path,
consumed for the mask and rolled back after it, so drafted tokens the grammar refuses are
rejected like any other disagreement and every speculation mode stays lossless.

With a thinking model whose answer starts by reasoning, the constraint starts after the think
block closes (`AnswerStart` finds the close tag in the output's text), as vLLM does; before
that, rows are unmasked. Once the grammar is complete only the sequence's stop ids may follow (the model's EOS
where it has none, e.g. with ignore_eos): the answer ends there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import llguidance

    from worker.models.loaded_model import LoadedModel

MAX_COMPILED_GRAMMARS = 64
_BIT_VALUES = torch.tensor([1 << bit for bit in range(8)], dtype=torch.uint8)  # bit i of a byte: token 8k+i


class GrammarUnavailable(ValueError):
    """A tokenizer llguidance cannot read: structured outputs are refused for this model."""


class GrammarViolation(RuntimeError):
    """A committed token the grammar refuses: the lane's state is broken, its request fails alone."""


class GrammarMasks:
    def __init__(
        self,
        tokenizer_json: str,
        vocab_size: int,
        eos_ids: Collection[int],
        device: torch.device | str,
        token_text: Callable[[int], str] = lambda token_id: "",
    ):
        self._tokenizer_json = tokenizer_json
        self.token_text = token_text  # one token's text, special tokens included (AnswerStart reads it)
        self.vocab_size = vocab_size  # the logits' width: the model's, which may exceed the tokenizer's
        self.eos_ids = frozenset(eos_ids)
        self.device = device  # the logits': masks go there
        self._lock = threading.Lock()  # the compiled grammars
        self._tokenizer_lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    @classmethod
    def for_model(cls, model: LoadedModel) -> GrammarMasks:
        """The masks of a loaded model: its tokenizer, its logits' width, EOS and device."""
        tokenizer = model.tokenizer

        def token_text(token_id: int) -> str:
            return tokenizer.decode([token_id], skip_special_tokens=False)

        eos_ids = model.checkpoint.eos_token_ids
        return cls(tokenizer.to_str(), model.config.vocab_size, eos_ids, model.decoder.device, token_text)

    def compile(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for `grammar` (compiled once, then copied); GrammarUnavailable where the
        tokenizer cannot be read, ValueError with the engine's message where it does not compile.
        The compile itself holds no lock: a slow grammar stalls only the thread that asked."""
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled.deep_copy()
        compiled = self._compile(grammar)
        with self._lock:
            self._compiled[grammar] = compiled
            if len(self._compiled) > MAX_COMPILED_GRAMMARS:
                self._compiled.popitem(last=False)
            return compiled.deep_copy()

    def is_compiled(self, grammar: str) -> bool:
        return grammar in self._compiled

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        import llguidance

        matcher = llguidance.LLMatcher(self._llg_tokenizer(), grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:

        with self._tokenizer_lock:  # read once, by whichever thread asks first
            if self._tokenizer is None:
                self._tokenizer = self._read_tokenizer()
        return self._tokenizer

    def _read_tokenizer(self) -> llguidance.LLTokenizer:
        import llguidance

        try:
            return llguidance.LLTokenizer(self._tokenizer_json, n_vocab=self.vocab_size, eos_token=sorted(self.eos_ids))
        except (ValueError, RuntimeError) as error:
            raise GrammarUnavailable(f"structured outputs cannot read this model's tokenizer: {error}") from None

    def tokenize_bytes(self, text: bytes) -> list[int]:
        return list(self._llg_tokenizer().tokenize_bytes(text))

    def ids_mask(self, token_ids: Collection[int]) -> torch.Tensor:  # [vocab_size] bool
        mask = torch.zeros(self.vocab_size, dtype=torch.bool)
        mask[torch.tensor(sorted(token_ids), dtype=torch.long)] = True
        return mask.to(self.device)

    def unpack(self, bitmask: bytes) -> torch.Tensor:  # [vocab_size] bool
        packed = torch.frombuffer(bytearray(bitmask), dtype=torch.uint8)  # [ceil(vocab / 32) * 4]
        bits = (packed.unsqueeze(1) & _BIT_VALUES) != 0  # [bytes, 8], little-endian within a byte
        return bits.reshape(-1)[: self.vocab_size].to(self.device)


class GrammarConstraint:
    """One sequence's progress through its grammar; `mask(history, num_committed)` for a row whose
    history is the committed output plus (maybe) a draft path. None: the row is not constrained
    (still reasoning)."""

    def __init__(
        self,
        masks: GrammarMasks,
        matcher: llguidance.LLMatcher,
        stop_ids: Collection[int],
        answer_start: AnswerStart | None = None,
    ):
        self._masks = masks
        self._matcher = matcher
        self._stop_ids = frozenset(stop_ids) or masks.eos_ids
        self._answer_start = answer_start
        self._start: int | None = None if answer_start else 0  # output index the grammar starts at
        self._num_consumed = 0  # output tokens before this index are in the matcher (or before the start)

    def mask(self, history: Sequence[int], num_committed: int) -> torch.Tensor | None:  # [vocab_size] bool
        self._consume_committed(history, num_committed)
        start = self._start
        if start is None:
            assert self._answer_start is not None
            start = self._answer_start.find(history, num_committed, commit=False)
        if start is None:
            return None
        draft = list(history[max(start, num_committed) :])
        if self._matcher.is_stopped():
            return self._masks.ids_mask(self._stop_ids)
        consumed = self._matcher.try_consume_tokens(draft) if draft else 0
        try:
            if consumed < len(draft):  # a path the grammar refuses: the walk never asks for it
                return self._masks.ids_mask(self._stop_ids)
            return self._current_mask()
        finally:
            if consumed:
                self._matcher.rollback(consumed)

    def forced_tokens(self, output_ids: Sequence[int], limit: int) -> list[int]:
        """What the grammar forces next, as tokens (up to `limit`), after the committed output.

        llguidance knows the bytes every continuation starts with (a key and its `":"`, a
        closing `"}`); their tokenization is the draft: the constrained target nearly always
        writes them so, and verification decides where it does not. Once the grammar is
        complete, or can only end, the sequence's stop token (where it has one). Empty while the
        answer has not started (still reasoning) or where the text is free."""
        self._consume_committed(output_ids, len(output_ids))
        if self._start is None or limit <= 0:
            return []
        matcher, stop = self._matcher, sorted(self._stop_ids)
        if matcher.is_stopped():
            return stop[:1] if len(stop) == 1 else []
        forced = matcher.compute_ff_bytes()
        if forced:
            return self._masks.tokenize_bytes(forced)[:limit]
        can_only_end = matcher.is_accepting() and _single_token(matcher.compute_bitmask()) in self._masks.eos_ids
        return stop if can_only_end and len(stop) == 1 else []

    def _current_mask(self) -> torch.Tensor:
        if self._matcher.is_stopped():
            return self._masks.ids_mask(self._stop_ids)
        allowed = self._masks.unpack(self._matcher.compute_bitmask())
        eos_ids = self._masks.eos_ids
        if any(bool(allowed[i]) for i in eos_ids):  # the grammar may end here: end with the stop ids
            allowed[sorted(eos_ids)] = False
            allowed[sorted(self._stop_ids)] = True
        return allowed

    def _consume_committed(self, history: Sequence[int], num_committed: int) -> None:
        if self._start is None:
            assert self._answer_start is not None
            self._start = self._answer_start.find(history, num_committed, commit=True)
            if self._start is None:
                self._num_consumed = num_committed
                return
        begin = max(self._start, self._num_consumed)
        for token_id in history[begin:num_committed]:
            if self._matcher.is_stopped():
                break  # past the end (EOS under ignore_eos): nothing more to match
            if token_id in self._stop_ids and self._matcher.is_accepting():
                break
            if not self._matcher.consume_token(token_id):
                raise GrammarViolation(f"token {token_id} breaks the grammar: {self._matcher.get_error()}")
        self._num_consumed = max(self._num_consumed, num_committed)


def _single_token(bitmask: bytes) -> int | None:
    """The one token a packed mask allows (bit i of the little-endian words: token i), or None."""
    bits = int.from_bytes(bitmask, "little")
    if bits == 0 or bits & (bits - 1):
        return None
    return bits.bit_length() - 1


class AnswerStart:
    """Where the answer starts in an output that opens by reasoning: just after the token that
    completes the think block's close tag, found in the tokens' text (a tokenizer may write the
    tag as one token, as several, or merged with what follows it). What the tag's last token holds
    after the tag (a line break, say) is left outside the grammar."""

    def __init__(self, end_tag: str, token_text: Callable[[int], str]):
        self._end_tag = end_tag
        self._token_text = token_text
        self._tail = ""  # the committed text's last characters, in which a tag may have begun
        self._num_scanned = 0  # committed tokens already looked at

    def find(self, history: Sequence[int], num_committed: int, commit: bool) -> int | None:
        """The answer's first index, or None while reasoning goes on. `commit`: look only at the
        committed tokens, and remember them; otherwise look at the whole history, remembering nothing."""
        end = num_committed if commit else len(history)
        first = self._num_scanned if commit else max(self._num_scanned, num_committed)
        tail = self._tail
        for index in range(first, end):
            tail = (tail + self._token_text(history[index]))[-(len(self._end_tag) + 64) :]
            if self._end_tag in tail:
                return index + 1
        if commit:
            self._tail, self._num_scanned = tail, end
        return None
