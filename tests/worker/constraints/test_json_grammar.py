"""The JSON state machine against Python's json module, the oracle for what JSON is."""

from __future__ import annotations

import json
import random

import pytest

from worker.constraints.json_grammar import INITIAL, MAX_WHITESPACE, feed, is_complete


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 5)
    if kind == 0:
        return rng.choice([True, False, None])
    if kind == 1:
        return rng.choice([0, -3, 12.5, 1e-7, -0.0, 123456789, 3.25e10, -2.5e-3])
    if kind == 2:
        return "".join(rng.choice('ab"\\\n/\t\u00e9\u4e2d\U0001f600') for _ in range(rng.randrange(6)))
    if kind in (3, 4):
        return rng.randrange(-50, 100)
    if kind == 5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(["k", "é", 'q"', ""]) + str(i): random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def accepts(text: bytes) -> bool:
    state = feed(INITIAL, text)
    return state is not None and is_complete(state)


def test_every_object_json_writes_is_accepted_and_each_of_its_prefixes_is_alive_but_unfinished():
    rng = random.Random(0)
    for _ in range(300):
        document = {str(i): random_value(rng) for i in range(rng.randrange(4))}
        text = json.dumps(document, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1, 2])).encode()
        assert accepts(text), text
        for cut in range(len(text)):
            state = feed(INITIAL, text[:cut])
            assert state is not None and not is_complete(state), (text, cut)


def test_a_mutated_document_is_accepted_exactly_when_json_reads_an_object():
    rng = random.Random(1)
    checked = 0
    for _ in range(3000):
        document = {str(i): random_value(rng) for i in range(rng.randrange(1, 4))}
        text = bytearray(json.dumps(document, indent=rng.choice([None, 2])).encode())
        text[rng.randrange(len(text))] = rng.choice(b'{}[]",:0-.eE tfnu\\x1')
        try:
            decoded = bytes(text).decode()
        except UnicodeDecodeError:
            continue  # string bytes pass unchecked, as they pass through the tokenizer
        if "\n" + " " * (MAX_WHITESPACE) in decoded:
            continue
        try:
            is_object = isinstance(json.loads(decoded), dict)
        except json.JSONDecodeError:
            is_object = False
        assert accepts(bytes(text)) == is_object, bytes(text)
        checked += 1
    assert checked > 2000


@pytest.mark.parametrize(
    "text",
    [
        b"[1, 2]",
        b'"a"',
        b"1",
        b'{"a": 01}',
        b'{"a": 1,}',
        b"{'a': 1}",
        b'{"a": -}',
        b'{"a": 1.}',
        b'{"a": 1e}',
        b'{"a": tru}',
        b'{"a": NaN}',
        b'{"a": "\x01"}',
        b'{"a": "\\x"}',
        b'{"a": "\\u12g4"}',
        b'{"a" 1}',
        b"{1: 2}",
        b'{"a": [1 2]}',
        b'{"a": 1} ',
        b'{"a": 1}{',
        b'{"a": .5}',
        b'{"a": +1}',
    ],
)
def test_what_is_not_a_json_object_is_refused(text):
    assert not accepts(text)


def test_whitespace_runs_are_bounded_so_a_model_cannot_pad_forever():
    assert accepts(b"{" + b" " * MAX_WHITESPACE + b"}")
    assert feed(INITIAL, b"{" + b" " * (MAX_WHITESPACE + 1)) is None
    assert accepts(b'{"a": "' + b" " * 100 + b'"}')  # inside a string spaces are text
