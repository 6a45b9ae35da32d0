"""Which tokens may come next in JSON mode: `json_grammar` lifted from bytes to a vocabulary.

A token is allowed from a state when all of its bytes can be read from there, one `step` each.
Trying every token on every step would be ~50k walks; two things make it cheap:

- Tokens are kept sorted by their bytes and walked in that order, so a token reuses the states
  of the prefix it shares with the one before, and once a prefix dies every token that starts
  with it is skipped in one bisect. From "expecting a value", ` the` dies at ` th` and takes
  ` then`, ` there`, ... with it.
- Inside a string, a token made only of string-safe bytes is always allowed and leaves the state
  as it was (most of a vocabulary). Only the other tokens, those holding a `"`, a `\\` or a
  control byte, are walked.

The answer depends on the state's mode and counter and on the innermost containers only: a token
can close at most `max_closers` of them. `cache_key` is that part, so masks can be cached by it.
Torch-free.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Sequence

import tokenizers

from worker.constraints.json_grammar import STRING_MODES, State, step, string_safe


class UnsupportedVocabulary(ValueError):
    """JSON mode needs each token's bytes; this tokenizer does not give them."""


class _SortedTokens:
    def __init__(self, pairs: list[tuple[bytes, int]]):  # sorted by bytes
        self.token_bytes = [token for token, _ in pairs]
        self.ids = [token_id for _, token_id in pairs]

    def walk(self, start: State) -> list[int]:
        """The ids of every token that can be read whole from `start`."""
        tokens, allowed = self.token_bytes, []
        states = [start]  # states[d]: after the first d bytes of `previous`
        previous = b""
        index = 0
        while index < len(tokens):
            token = tokens[index]
            depth = _common_prefix_length(previous, token)
            del states[depth + 1 :]
            while depth < len(token):
                following = step(states[depth], token[depth])
                if following is None:
                    break
                states.append(following)
                depth += 1
            if depth == len(token):
                allowed.append(self.ids[index])
                previous, index = token, index + 1
            else:  # token[:depth + 1] is dead, and so is every token that starts with it
                previous = token[:depth]
                after = _successor(token[: depth + 1])
                index = len(tokens) if after is None else bisect.bisect_left(tokens, after, index + 1)
        return allowed


class JsonVocabulary:
    def __init__(self, token_bytes: Sequence[bytes | None]):
        """`token_bytes[i]`: token i's bytes; None or b"" for a token JSON text never contains
        (special tokens)."""
        pairs = sorted((token, token_id) for token_id, token in enumerate(token_bytes) if token)
        safe = [all(string_safe(byte) for byte in token) for token, _ in pairs]
        self._all = _SortedTokens(pairs)
        self._not_string_safe = _SortedTokens([pair for pair, ok in zip(pairs, safe, strict=True) if not ok])
        self._string_safe_ids = [token_id for (_, token_id), ok in zip(pairs, safe, strict=True) if ok]
        self.max_closers = max((token.count(b"}") + token.count(b"]") for token, _ in pairs), default=0)

    def allowed_ids(self, state: State) -> list[int]:
        """Token ids that may come next (not the end of text: see json_grammar.is_complete)."""
        if state[0] in STRING_MODES:
            return self._string_safe_ids + self._not_string_safe.walk(state)
        return self._all.walk(state)

    def cache_key(self, state: State) -> State:
        """The part of `state` that `allowed_ids` depends on: the containers a token can close,
        and the one around them (what a comma after them means, or that none is left)."""
        mode, stack, aux = state
        return (mode, stack[-(self.max_closers + 1) :], aux)


def byte_level_token_bytes(tokenizer: tokenizers.Tokenizer) -> list[bytes | None]:
    """Each token's bytes for a byte-level BPE tokenizer (GPT-2's, Llama 3's, Qwen's, SmolLM's):
    its vocabulary spells every byte as one printable character. Added tokens map to None."""
    decoder = json.loads(tokenizer.to_str()).get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        raise UnsupportedVocabulary(
            "response_format json_object needs a byte-level BPE tokenizer; this model's "
            f"decoder is {decoder.get('type')!r}"
        )
    byte_of = {char: byte for byte, char in _bytes_to_unicode().items()}
    added = set(tokenizer.get_added_tokens_decoder())
    token_bytes: list[bytes | None] = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.id_to_token(token_id)
        if token_id in added or text is None or any(char not in byte_of for char in text):
            token_bytes.append(None)
        else:
            token_bytes.append(bytes(byte_of[char] for char in text))
    return token_bytes


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the rest move up past U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def _common_prefix_length(a: bytes, b: bytes) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length


def _successor(prefix: bytes) -> bytes | None:
    """The smallest byte string above every string that starts with `prefix` (None: there is none)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])
