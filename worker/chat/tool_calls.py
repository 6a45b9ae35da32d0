"""Streaming parser for Hermes/Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Text outside the tags is content. Each tagged JSON object becomes an OpenAI tool call, streamed as
deltas: a first delta with index, id, type and name (arguments ""), then argument fragments as
the model writes them. A call that turns out malformed, or is still open when the output ends,
is given back as content, tags included, so no text is ever lost.

Decisions, for the callers:
- Argument fragments are the model's own text of the arguments object (whitespace included),
  so they can stream before the object is complete; their concatenation parses as JSON equal to
  the model's object. Missing arguments stream as "{}"; arguments the model wrote as a JSON
  string holding an object stream as that string's text, in one fragment once the call closes.
- The first delta goes out as soon as the name string is complete. If the call later proves
  malformed (bad JSON, a repeated key, output ending mid-call) those deltas cannot be taken
  back: its raw text also arrives as content and `finish()` leaves it out, and its index stays
  used. Every chunking of the same text yields the same deltas, concatenated.
- Content between and after calls (often just "\\n") is passed through verbatim.
"""

from __future__ import annotations

import copy
import enum
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

START_TAG = "<tool_call>"
END_TAG = "</tool_call>"


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@dataclass(slots=True)
class ToolCallDelta:
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI streaming tool-call deltas


class _Stage(enum.Enum):
    START = "start"  # before "{"
    KEY = "key"  # expecting a key or "}"
    IN_KEY = "in_key"
    COLON = "colon"
    VALUE = "value"  # expecting a value
    IN_STRING = "in_string"  # a string value
    IN_NESTED = "in_nested"  # an object or array value, any depth
    IN_SCALAR = "in_scalar"  # a number, true, false or null
    AFTER_VALUE = "after_value"  # expecting "," or "}"
    DONE = "done"
    BROKEN = "broken"


_WHITESPACE = " \t\n\r"  # JSON's whitespace, no more
_TRANSITIONS = {
    (_Stage.START, "{"): _Stage.KEY,
    (_Stage.KEY, '"'): _Stage.IN_KEY,
    (_Stage.KEY, "}"): _Stage.DONE,
    (_Stage.COLON, ":"): _Stage.VALUE,
    (_Stage.AFTER_VALUE, ","): _Stage.KEY,
    (_Stage.AFTER_VALUE, "}"): _Stage.DONE,
}


# The member scanner, by example. Fed '{"name": "f", "arguments": {"a": [1, "}"]' in any pieces,
# it walks the top-level object one character at a time and records where each finished member's
# value lies: name -> '"f"'. The arguments value is still open (nesting depth 1 inside it, the
# "}" in the string does not count), so object_member_prefix("arguments") is its text so far,
# '{"a": [1, "}"]'. Nested values are only bracket-matched, not validated: the caller decides
# validity with json.loads once the body is complete; the scanner only tells what may stream.


@dataclass(slots=True)
class _MemberScanner:
    text: str = ""  # the call body so far
    stage: _Stage = _Stage.START
    _pos: int = 0  # next character to scan
    _escaped: bool = False
    _in_nested_string: bool = False
    _nest: int = 0
    _token_start: int = 0  # where the current key or value began
    _key: str = ""  # key of the member being read
    _spans: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> value [start, end)
    # json.loads keeps a repeated key's last value, but streaming has already sent the first
    # one; a repeated key therefore makes the call malformed, whatever the chunking.
    has_repeated_key: bool = False

    def feed(self, text: str) -> None:
        self.text += text
        while self._pos < len(self.text) and self.stage is not _Stage.BROKEN:
            self._scan(self.text[self._pos])
            self._pos += 1

    def string_member(self, key: str) -> str | None:
        """The decoded value of a finished string member, else None."""
        start, end = self._spans.get(key, (0, 0))
        if not self.text[start:end].startswith('"'):
            return None
        try:
            value: str = json.loads(self.text[start:end])  # a JSON string: it starts with '"'
            return value
        except ValueError:
            return None

    def object_member_prefix(self, key: str) -> str:
        """The text of an object member's value so far (all of it once finished), else ""."""
        if key in self._spans:
            start, end = self._spans[key]
        elif self.stage is _Stage.IN_NESTED and self._key == key:
            start, end = self._token_start, self._pos
        else:
            return ""
        return self.text[start:end] if self.text[start] == "{" else ""

    def _scan(self, c: str) -> None:
        match self.stage:
            case _Stage.IN_KEY | _Stage.IN_STRING:
                if self._string_closes(c):
                    self._close_string()
            case _Stage.IN_NESTED:
                self._scan_nested(c)
            case _Stage.IN_SCALAR:
                self._scan_scalar(c)
            case _:
                self._scan_structure(c)

    def _scan_structure(self, c: str) -> None:
        if c in _WHITESPACE:
            return
        if self.stage is _Stage.VALUE:
            self._start_value(c)
            return
        self.stage = _TRANSITIONS.get((self.stage, c), _Stage.BROKEN)
        self._token_start = self._pos

    def _start_value(self, c: str) -> None:
        self._token_start = self._pos
        if c == '"':
            self.stage = _Stage.IN_STRING
        elif c in "{[":
            self.stage, self._nest = _Stage.IN_NESTED, 1
        else:
            self.stage = _Stage.BROKEN if c in ",:}]" else _Stage.IN_SCALAR

    def _string_closes(self, c: str) -> bool:
        if self._escaped:
            self._escaped = False
            return False
        self._escaped = c == "\\"
        return c == '"'

    def _close_string(self) -> None:
        if self.stage is _Stage.IN_STRING:
            self._end_value(self._pos + 1)
            return
        try:
            self._key = json.loads(self.text[self._token_start : self._pos + 1])
            self.stage = _Stage.COLON
        except ValueError:
            self.stage = _Stage.BROKEN

    def _scan_nested(self, c: str) -> None:
        if self._in_nested_string:
            self._in_nested_string = not self._string_closes(c)
        elif c == '"':
            self._in_nested_string = True
        elif c in "{[":
            self._nest += 1
        elif c in "}]":
            self._nest -= 1
            if self._nest == 0:
                self._end_value(self._pos + 1)

    def _scan_scalar(self, c: str) -> None:
        # A scalar ends at the first delimiter, which then counts as structure.
        if c in _WHITESPACE or c in ",}":
            self._end_value(self._pos)
            self._scan_structure(c)

    def _end_value(self, end: int) -> None:
        self.has_repeated_key |= self._key in self._spans
        self._spans.setdefault(self._key, (self._token_start, end))
        self.stage = _Stage.AFTER_VALUE


@dataclass(slots=True)
class _OpenCall:
    scanner: _MemberScanner = field(default_factory=_MemberScanner)  # body text so far
    index: int | None = None  # set when the first delta goes out
    call_id: str = ""
    name: str = ""
    sent_arguments: str = ""


class ToolCallParser:
    def __init__(self, new_call_id: Callable[[], str] = new_tool_call_id, max_calls: int | None = None):
        self._new_call_id = new_call_id
        self._max_calls = max_calls  # after that many calls the parser is `done`: the rest is not output
        self._buffer = ""  # received, not yet consumed: a possible partial tag
        self._call: _OpenCall | None = None
        self._num_indices = 0
        self._finished: list[dict[str, Any]] = []

    @property
    def in_tool_call(self) -> bool:
        return self._call is not None

    @property
    def done(self) -> bool:
        """`max_calls` well-formed calls have closed: what follows them is dropped."""
        return self._max_calls is not None and len(self._finished) >= self._max_calls

    def feed(self, text: str) -> ToolCallDelta:
        self._buffer += text
        delta = ToolCallDelta()
        while not self.done and self._step(delta):
            pass
        if self.done:
            self._buffer = ""
        return delta

    def flush(self) -> ToolCallDelta:
        """End of output: a partial tag, or a call never closed, becomes content."""
        delta = self.feed("")
        if self._call is not None:
            delta.content += START_TAG + self._call.scanner.text
            self._call = None
        delta.content += self._buffer
        self._buffer = ""
        return delta

    def finish(self) -> list[dict[str, Any]]:
        """Every well-formed call so far, as complete OpenAI tool calls (non-streaming responses)."""
        return copy.deepcopy(self._finished)

    def _step(self, delta: ToolCallDelta) -> bool:
        """Consume what the buffer allows; True if a tag was crossed and the rest needs another look."""
        tag = END_TAG if self._call is not None else START_TAG
        i = self._buffer.find(tag)
        usable = i if i >= 0 else len(self._buffer) - _held_len(self._buffer, tag)
        if self._call is None:
            delta.content += self._buffer[:usable]
        else:
            self._call.scanner.feed(self._buffer[:usable])
            self._stream(self._call, delta)
        self._buffer = self._buffer[usable + (len(tag) if i >= 0 else 0) :]
        if i < 0:
            return False
        if self._call is None:
            self._call = _OpenCall()
        else:
            self._close(delta)
        return True

    def _stream(self, call: _OpenCall, delta: ToolCallDelta) -> None:
        if call.index is None:
            name = call.scanner.string_member("name")
            if name is None:
                return
            self._start(call, name, delta)
        prefix = call.scanner.object_member_prefix("arguments")
        if len(prefix) > len(call.sent_arguments) and prefix.startswith(call.sent_arguments):
            self._send_arguments(call, prefix, delta)

    def _start(self, call: _OpenCall, name: str, delta: ToolCallDelta) -> None:
        call.index, call.call_id, call.name = self._num_indices, self._new_call_id(), name
        self._num_indices += 1
        function = {"name": name, "arguments": ""}
        delta.tool_calls.append({"index": call.index, "id": call.call_id, "type": "function", "function": function})

    def _send_arguments(self, call: _OpenCall, arguments: str, delta: ToolCallDelta) -> None:
        fragment = arguments[len(call.sent_arguments) :]
        call.sent_arguments = arguments
        delta.tool_calls.append({"index": call.index, "function": {"arguments": fragment}})

    def _close(self, delta: ToolCallDelta) -> None:
        call, self._call = self._call, None
        assert call is not None
        parsed = _parse_call(call.scanner)
        if parsed is None or not _extends_sent(call, *parsed):
            delta.content += START_TAG + call.scanner.text + END_TAG
            return
        name, arguments = parsed
        if call.index is None:
            self._start(call, name, delta)
        if arguments != call.sent_arguments:
            self._send_arguments(call, arguments, delta)
        function = {"name": name, "arguments": arguments}
        self._finished.append({"id": call.call_id, "type": "function", "function": function})


def _parse_call(scanner: _MemberScanner) -> tuple[str, str] | None:
    """(name, arguments JSON text) of a well-formed call body, else None."""
    if scanner.has_repeated_key:
        return None
    try:
        body = json.loads(scanner.text)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return None
    if "arguments" not in body:
        return body["name"], "{}"
    arguments = body["arguments"]
    if isinstance(arguments, dict):
        return body["name"], scanner.object_member_prefix("arguments")  # json.loads-equal by the scan
    if isinstance(arguments, str) and _is_json_object(arguments):
        return body["name"], arguments
    return None


def _extends_sent(call: _OpenCall, name: str, arguments: str) -> bool:
    # Sent deltas cannot be revised. The scanner makes them agree with json.loads; this check
    # turns a disagreement it missed into content rather than a call that differs from its stream.
    return (call.index is None or call.name == name) and arguments.startswith(call.sent_arguments)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _held_len(buffer: str, tag: str) -> int:
    """Length of the longest buffer suffix that is a proper prefix of tag."""
    for n in range(min(len(buffer), len(tag) - 1), 0, -1):
        if buffer.endswith(tag[:n]):
            return n
    return 0
