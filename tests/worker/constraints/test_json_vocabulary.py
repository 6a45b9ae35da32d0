"""Token masks for JSON mode against the brute force they shortcut: every token fed byte by byte."""

from __future__ import annotations

import json
import random

import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from tests.support.tiny_models import train_tokenizer
from worker.constraints.json_grammar import INITIAL, feed
from worker.constraints.json_vocabulary import JsonVocabulary, UnsupportedVocabulary, byte_level_token_bytes

# Bytes a JSON walk trips over: quotes, escapes, closers, digits, a 0xff run (the sort's edge).
SYNTHETIC = [
    b"{",
    b"}",
    b'"',
    b'"}',
    b'"]}',
    b'":',
    b'": "',
    b"1",
    b"12",
    b"0",
    b"-",
    b".5",
    b"e+",
    b"true",
    b"tr",
    b"ue",
    b"null",
    b"[",
    b"]",
    b"],",
    b"},",
    b", ",
    b" ",
    b"\n  ",
    b"\\",
    b'\\"',
    b"\\u",
    b"00e9",
    b"a",
    b"ab",
    b'a"',
    b"\xff",
    b"\xff\xff",
    b"\xff\xfe",
    b"\x01",
    b"\xc3\xa9",
    b" the",
    b" tr",
    None,
    b"",
]


def brute_force(token_bytes, state) -> list[int]:
    return sorted(i for i, token in enumerate(token_bytes) if token and feed(state, token) is not None)


def reachable_states(rng: random.Random, count: int):
    """States part way through random JSON objects, nested up to five deep."""
    states = []
    while len(states) < count:
        value = {"k": [{"a": [1, {"b": 'x\\u00e9"y'}], "c": -2.5e3}, True, None, "s t"], "z": {"w": [[[]]]}}
        text = json.dumps(value, indent=rng.choice([None, 2])).encode()
        state = feed(INITIAL, text[: rng.randrange(len(text))])
        assert state is not None
        states.append(state)
    return states


def test_allowed_ids_equal_feeding_every_token_on_a_synthetic_vocabulary():
    vocabulary = JsonVocabulary(SYNTHETIC)
    for state in reachable_states(random.Random(0), 300):
        assert sorted(vocabulary.allowed_ids(state)) == brute_force(SYNTHETIC, state), state


def test_allowed_ids_equal_feeding_every_token_on_a_trained_byte_level_vocabulary():
    token_bytes = byte_level_token_bytes(train_tokenizer())
    vocabulary = JsonVocabulary(token_bytes)
    for state in reachable_states(random.Random(1), 200):
        assert sorted(vocabulary.allowed_ids(state)) == brute_force(token_bytes, state), state


def test_states_with_one_cache_key_allow_the_same_tokens():
    """The key keeps the containers a token can close and the one around them: deeper ones differ
    between these states, and must not change the answer."""
    vocabulary = JsonVocabulary(SYNTHETIC)
    assert vocabulary.max_closers == 2  # '"]}'
    rng = random.Random(2)
    by_key: dict = {}
    for state in reachable_states(rng, 400):
        for prefix in ("", "o", "ao", "oaoa"):
            deeper = (state[0], prefix + state[1], state[2]) if state[1] else state
            allowed = sorted(vocabulary.allowed_ids(deeper))
            key = vocabulary.cache_key(deeper)
            assert by_key.setdefault(key, allowed) == allowed, (state, prefix)


def test_token_bytes_are_what_the_tokenizer_decodes():
    tokenizer = train_tokenizer()
    token_bytes = byte_level_token_bytes(tokenizer)
    added = set(tokenizer.get_added_tokens_decoder())
    assert all(token_bytes[i] is None for i in added)
    for token_id, data in enumerate(token_bytes):
        if data is not None:
            assert tokenizer.decode([token_id]) == data.decode(errors="replace"), token_id


def test_a_tokenizer_that_is_not_byte_level_is_refused_by_name():
    tokenizer = tokenizers.Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.decoder = decoders.WordPiece()
    with pytest.raises(UnsupportedVocabulary, match="byte-level BPE"):
        byte_level_token_bytes(tokenizer)
