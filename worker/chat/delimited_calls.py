"""The streaming split for tool-call formats whose calls are read whole: content, then a marker,
then a call body the format's `scan` reads once it is complete.

Used by qwen3_xml, llama3_json and mistral (Hermes streams its arguments as they come, in
worker/chat/tool_calls.py). A call goes out as one delta, name and arguments together, when its
body closes; nothing before that point is ever taken back, and the decision to close depends on
the text alone, so any chunking of the same text gives the same content and the same calls.

By example, mistral, fed '[TOOL_CA', 'LLS]get', '[ARGS]{"a": 1}':
    '[TOOL_CA'   content mode: held back, it may be the start of the marker -> nothing out
    'LLS]get'    the marker is complete: call mode, scan('get') needs more -> nothing out
    '[ARGS]{..}' scan says: one call, get({"a": 1}), consumed all -> one tool-call delta
A body the scan refuses comes back as content, marker included, exactly as written.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from worker.chat.tool_calls import ToolCallDelta, new_tool_call_id

_JSON_TOKENS = re.compile(r'(?P<string>"[^"\\]*(?:\\.[^"\\]*)*(?P<closed>")?)|[{}\[\]]', re.DOTALL)
_SEPARATORS = " \t\r\n;"  # between two brace-opened calls (Llama writes "; " or a line break)


@dataclass(frozen=True, slots=True)
class Scan:
    calls: list[tuple[str, dict[str, Any]]] | None  # None: malformed, the text is content
    num_consumed: int  # characters of the body the calls (or the malformed text) take


class CallFormat(Protocol):
    @property
    def markers(self) -> tuple[str, ...]:
        """Text that opens a call anywhere in the output."""
        ...

    @property
    def opens_on_brace(self) -> bool:
        """A "{" opens a call at the output's start (whitespace aside) and right after a call."""
        ...

    def scan(self, marker: str, body: str) -> Scan | None:
        """The calls a complete body holds, or None while it may still grow into one."""
        ...


class DelimitedCallParser:
    def __init__(
        self, call_format: CallFormat, max_calls: int | None = None, new_call_id: Callable[[], str] = new_tool_call_id
    ):
        self._format = call_format
        self._max_calls = max_calls
        self._new_call_id = new_call_id
        self._buffer = ""  # received, not yet decided
        self._marker: str | None = None  # inside a call body when set ("" for a brace-opened one)
        self._at_boundary = call_format.opens_on_brace
        self._calls: list[dict[str, Any]] = []

    @property
    def done(self) -> bool:
        return self._max_calls is not None and len(self._calls) >= self._max_calls

    def feed(self, text: str) -> ToolCallDelta:
        self._buffer += text
        delta = ToolCallDelta()
        while not self.done and self._step(delta):
            pass
        if self.done:
            self._buffer = ""
        return delta

    def flush(self) -> ToolCallDelta:
        delta = self.feed("")
        if not self.done:
            delta.content += (self._marker or "") + self._buffer
        self._buffer, self._marker = "", None
        return delta

    def finish(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._calls)

    def _step(self, delta: ToolCallDelta) -> bool:
        """Consume what the buffer allows; True when the rest needs another look."""
        if self._marker is not None:
            return self._step_call(delta)
        if self._at_boundary:
            return self._step_boundary()
        return self._step_content(delta)

    def _step_boundary(self) -> bool:
        rest = self._buffer.lstrip(_SEPARATORS)
        if not rest:
            return False  # only separators so far: the next character decides
        self._at_boundary = False
        if rest[0] == "{":
            self._marker, self._buffer = "", rest
        return True

    def _step_content(self, delta: ToolCallDelta) -> bool:
        found = [(i, marker) for marker in self._format.markers if (i := self._buffer.find(marker)) >= 0]
        if not found:
            usable = len(self._buffer) - max(_held_len(self._buffer, m) for m in self._format.markers)
            delta.content += self._buffer[:usable]
            self._buffer = self._buffer[usable:]
            return False
        i, marker = min(found)
        delta.content += self._buffer[:i]
        self._marker, self._buffer = marker, self._buffer[i + len(marker) :]
        return True

    def _step_call(self, delta: ToolCallDelta) -> bool:
        assert self._marker is not None
        scan = self._format.scan(self._marker, self._buffer)
        if scan is None:
            return False
        raw = self._marker + self._buffer[: scan.num_consumed]
        self._buffer, self._marker = self._buffer[scan.num_consumed :], None
        if scan.calls is None:
            delta.content += raw
            return True
        for name, arguments in scan.calls:
            if not self.done:
                self._emit(name, arguments, delta)
        self._at_boundary = self._format.opens_on_brace
        return True

    def _emit(self, name: str, arguments: dict[str, Any], delta: ToolCallDelta) -> None:
        function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
        call = {"id": self._new_call_id(), "type": "function", "function": function}
        delta.tool_calls.append({"index": len(self._calls), **copy.deepcopy(call)})
        self._calls.append(call)


def json_value_end(text: str, start: int) -> int | None:
    """Where the object or array opening at `start` ends (the index after it), bracket-matched
    outside strings; None while it is still open. Validity is json.loads' to decide. The body is
    scanned again as it grows, so strings are skipped by the regex engine, not character by
    character: a long argument (a file's text) costs C-speed passes."""
    depth = 0
    for token in _JSON_TOKENS.finditer(text, start):
        if token["string"] is not None:
            if token["closed"] is None:
                return None  # a string still open
            continue
        depth += 1 if token[0] in "{[" else -1
        if depth == 0:
            return token.end()
    return None


def skip_whitespace(text: str, start: int = 0) -> int:
    while start < len(text) and text[start] in " \t\r\n":
        start += 1
    return start


def json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def arguments_object(value: Any) -> dict[str, Any] | None:
    """A call's arguments: an object, or (as some models write them) a JSON string holding one."""
    if isinstance(value, str):
        value = json_or_none(value)
    return value if isinstance(value, dict) else None


def _held_len(buffer: str, marker: str) -> int:
    """Length of the longest buffer suffix that is a proper prefix of the marker."""
    for n in range(min(len(buffer), len(marker) - 1), 0, -1):
        if buffer.endswith(marker[:n]):
            return n
    return 0
