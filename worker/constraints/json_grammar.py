"""JSON text as a byte-level state machine, for JSON mode (`response_format: {"type": "json_object"}`).

Strict RFC 8259 JSON whose top-level value is an object, as OpenAI's JSON mode promises, read one
byte at a time: `step(state, byte)` is the state after that byte, or None where JSON cannot go on.
Torch-free; `json_vocabulary` lifts it from bytes to tokens.

A state is a plain tuple `(mode, stack, aux)`, hashable so token masks can be cached by it:

    mode   where we are: expecting a value, inside a key string, after a value, in a number...
    stack  the open containers, outermost first: "o" an object, "a" an array
    aux    a small counter: the whitespace run in modes that allow whitespace (at most
           MAX_WHITESPACE, so a model cannot pad forever), the hex digits left in a \\u escape,
           or which literal (true/false/null) and how far into it

Example: `{"a": [1, tr` is (LITERAL, "oa", 8 * 0 + 2): inside an object and an array, two bytes
into "true". A number ends at the first byte that cannot continue it, which is then read as the
byte after a value (numbers only occur inside a container, since the top level is an object).
Strings are bytes: any byte from 0x20 up but `"` and `\\` stands for itself, so UTF-8 passes
through unchecked, the way it does through the tokenizer.
"""

from __future__ import annotations

State = tuple[int, str, int]

MAX_WHITESPACE = 16  # longest whitespace run between tokens: room for pretty-printing, not for padding

(
    START,
    OBJECT_FIRST,
    OBJECT_NEXT,
    COLON,
    VALUE,
    ARRAY_FIRST,
    AFTER_VALUE,
    KEY_STRING,
    VALUE_STRING,
    KEY_ESCAPE,
    VALUE_ESCAPE,
    KEY_HEX,
    VALUE_HEX,
    LITERAL,
    NUM_MINUS,
    NUM_ZERO,
    NUM_INT,
    NUM_DOT,
    NUM_FRAC,
    NUM_E,
    NUM_E_SIGN,
    NUM_EXP,
    DONE,
) = range(23)

STRING_MODES = frozenset({KEY_STRING, VALUE_STRING})
_WHITESPACE = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPED = frozenset(b'"\\/bfnrt')
_LITERALS = (b"true", b"false", b"null")
_LITERAL_FIRST = {literal[0]: index for index, literal in enumerate(_LITERALS)}
_QUOTE, _BACKSLASH = ord('"'), ord("\\")

INITIAL: State = (START, "", 0)


def is_complete(state: State) -> bool:
    """The top-level object is closed: only the end of the text may follow."""
    return state[0] == DONE


def string_safe(byte: int) -> bool:
    """A byte that stands for itself inside a string (and leaves the string state unchanged)."""
    return byte >= 0x20 and byte != _QUOTE and byte != _BACKSLASH


def step(state: State, byte: int) -> State | None:
    mode, stack, aux = state
    if mode in STRING_MODES:
        if string_safe(byte):
            return state
        if byte == _QUOTE:
            return (COLON, stack, 0) if mode == KEY_STRING else _after_value(stack)
        return (mode + 2, stack, 0) if byte == _BACKSLASH else None  # KEY_ESCAPE / VALUE_ESCAPE
    if byte in _WHITESPACE and mode <= AFTER_VALUE:  # the modes between tokens
        return (mode, stack, aux + 1) if aux < MAX_WHITESPACE else None
    return _STEPS[mode](stack, aux, byte)


def _after_value(stack: str) -> State:
    return (AFTER_VALUE, stack, 0) if stack else (DONE, "", 0)


def _start(stack: str, aux: int, byte: int) -> State | None:
    return (OBJECT_FIRST, "o", 0) if byte == ord("{") else None


def _object_first(stack: str, aux: int, byte: int) -> State | None:
    if byte == ord("}"):
        return _after_value(stack[:-1])
    return _object_next(stack, aux, byte)


def _object_next(stack: str, aux: int, byte: int) -> State | None:
    return (KEY_STRING, stack, 0) if byte == _QUOTE else None


def _colon(stack: str, aux: int, byte: int) -> State | None:
    return (VALUE, stack, 0) if byte == ord(":") else None


def _value(stack: str, aux: int, byte: int) -> State | None:
    if byte == ord("{"):
        return (OBJECT_FIRST, stack + "o", 0)
    if byte == ord("["):
        return (ARRAY_FIRST, stack + "a", 0)
    if byte == _QUOTE:
        return (VALUE_STRING, stack, 0)
    if byte == ord("-"):
        return (NUM_MINUS, stack, 0)
    if byte == ord("0"):
        return (NUM_ZERO, stack, 0)
    if byte in _DIGITS:
        return (NUM_INT, stack, 0)
    literal = _LITERAL_FIRST.get(byte)
    return None if literal is None else (LITERAL, stack, 8 * literal + 1)


def _array_first(stack: str, aux: int, byte: int) -> State | None:
    if byte == ord("]"):
        return _after_value(stack[:-1])
    return _value(stack, aux, byte)


def _after(stack: str, aux: int, byte: int) -> State | None:
    top = stack[-1]
    if byte == ord(","):
        return (OBJECT_NEXT, stack, 0) if top == "o" else (VALUE, stack, 0)
    if byte == (ord("}") if top == "o" else ord("]")):
        return _after_value(stack[:-1])
    return None


def _escape(mode: int):
    def escape(stack: str, aux: int, byte: int) -> State | None:
        if byte in _ESCAPED:
            return (mode, stack, 0)
        return (mode + 4, stack, 4) if byte == ord("u") else None  # KEY_HEX / VALUE_HEX, 4 digits to go

    return escape


def _hex(mode: int):
    def hex_digit(stack: str, aux: int, byte: int) -> State | None:
        if byte not in _HEX:
            return None
        return (mode, stack, 0) if aux == 1 else (mode + 4, stack, aux - 1)

    return hex_digit


def _literal(stack: str, aux: int, byte: int) -> State | None:
    index, position = divmod(aux, 8)
    text = _LITERALS[index]
    if byte != text[position]:
        return None
    return _after_value(stack) if position + 1 == len(text) else (LITERAL, stack, aux + 1)


def _number(continuations: dict[int, int], digits_to: int | None, may_end: bool):
    """A number mode: `continuations` maps bytes to the next mode, digits go to `digits_to`; where
    the number may end, any other byte is read as the byte after a value."""

    def number(stack: str, aux: int, byte: int) -> State | None:
        following = continuations.get(byte)
        if following is not None:
            return (following, stack, 0)
        if digits_to is not None and byte in _DIGITS:
            return (digits_to, stack, 0)
        if not may_end:
            return None
        return step(_after_value(stack), byte)

    return number


_EXPONENT = {ord("e"): NUM_E, ord("E"): NUM_E}
_STEPS = {
    START: _start,
    OBJECT_FIRST: _object_first,
    OBJECT_NEXT: _object_next,
    COLON: _colon,
    VALUE: _value,
    ARRAY_FIRST: _array_first,
    AFTER_VALUE: _after,
    KEY_ESCAPE: _escape(KEY_STRING),
    VALUE_ESCAPE: _escape(VALUE_STRING),
    KEY_HEX: _hex(KEY_STRING),
    VALUE_HEX: _hex(VALUE_STRING),
    LITERAL: _literal,
    NUM_MINUS: _number({ord("0"): NUM_ZERO}, NUM_INT, may_end=False),  # "-0" and "-5" both start here
    NUM_ZERO: _number({ord("."): NUM_DOT, **_EXPONENT}, None, may_end=True),  # no leading zeros
    NUM_INT: _number({ord("."): NUM_DOT, **_EXPONENT}, NUM_INT, may_end=True),
    NUM_DOT: _number({}, NUM_FRAC, may_end=False),
    NUM_FRAC: _number(_EXPONENT, NUM_FRAC, may_end=True),
    NUM_E: _number({ord("+"): NUM_E_SIGN, ord("-"): NUM_E_SIGN}, NUM_EXP, may_end=False),
    NUM_E_SIGN: _number({}, NUM_EXP, may_end=False),
    NUM_EXP: _number({}, NUM_EXP, may_end=True),
    DONE: lambda stack, aux, byte: None,
}


def feed(state: State | None, data: bytes) -> State | None:
    """The state after all of `data`, or None where it stops being JSON."""
    for byte in data:
        if state is None:
            return None
        state = step(state, byte)
    return state
