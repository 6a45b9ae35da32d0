"""Token ids -> text, a few tokens at a time, never emitting half a character.

Decoding token by token and concatenating is wrong twice over: byte-level vocabularies split one
UTF-8 character across tokens (a lone piece decodes to U+FFFD), and SentencePiece-style decoders
drop the leading space of whatever comes *first* in a decode call. So, as vLLM does, keep two
offsets into the token ids and decode a small window that starts one emitted chunk back:

    ids:   ... | prefix_offset ... read_offset | ... new ids
    prefix_text = decode(ids[prefix_offset:read_offset])     (already emitted)
    full_text   = decode(ids[prefix_offset:])
    new text    = full_text[len(prefix_text):]

Both decodes start at the same token, so a dropped leading space is dropped from both and the
difference is exact. If `full_text` ends with U+FFFD the last character is still incomplete: emit
nothing and keep the offsets until more ids arrive (or `flush`). Example with "é" = C3 A9 split
over two byte tokens: push([C3]) -> "" (decodes to "\ufffd"), push([A9]) -> "é".

A prompt that itself ends inside a character cannot be completed by the output (its prefix text
already holds the U+FFFD); as in vLLM, the output then starts at the next whole character.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

_REPLACEMENT = "\ufffd"
# Prompt tokens kept as left context for the first output tokens (vLLM keeps five).
_NUM_CONTEXT_IDS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        # The prompt's last ids are left context only: they count as already shown.
        self._ids = list(prompt_ids[self._context_start(prompt_ids) :])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    def push(self, token_ids: Sequence[int]) -> str:
        """Add generated ids; return only the text they complete."""
        self._ids.extend(token_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Everything still held back, an unfinished character included (as U+FFFD)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or (full_text.endswith(_REPLACEMENT) and not final):
            return ""
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return full_text[len(prefix_text) :]

    def _context_start(self, prompt_ids: Sequence[int]) -> int:
        """Where the prompt context starts: five ids back, and never after the last visible token.

        A context of skipped special tokens only would make the first output token the first
        token decoded, and a SentencePiece decoder would then drop its leading space.
        """
        if not prompt_ids:
            return 0
        last_visible = len(prompt_ids) - 1
        while last_visible > 0 and not self._decode([prompt_ids[last_visible]]):
            last_visible -= 1
        return min(max(len(prompt_ids) - _NUM_CONTEXT_IDS, 0), last_visible)

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)
