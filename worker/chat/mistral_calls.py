"""Mistral tool calls: `[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]` (v3 tokenizers) and
the newer `[TOOL_CALLS]f[ARGS]{...}` (one call per marker, Magistral / Mistral Small 3.2+)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from worker.chat.delimited_calls import Scan, arguments_object, json_or_none, json_value_end, skip_whitespace

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
_NAME_CHARS = re.compile(r"[A-Za-z0-9_.\-]*")
MAX_NAME_CHARS = 256


@dataclass(frozen=True, slots=True)
class MistralFormat:
    markers: tuple[str, ...] = (TOOL_CALLS,)
    opens_on_brace: bool = False

    def scan(self, marker: str, body: str) -> Scan | None:
        start = skip_whitespace(body)
        if start == len(body):
            return None
        if body[start] == "[":
            return _scan_list(body, start)
        return _scan_named(body, start)


def _scan_list(body: str, start: int) -> Scan | None:
    end = json_value_end(body, start)
    if end is None:
        return None
    value = json_or_none(body[start:end])
    if not isinstance(value, list) or not value:
        return Scan(None, end)
    calls = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return Scan(None, end)
        arguments = arguments_object(item.get("arguments", {}))
        if arguments is None:
            return Scan(None, end)
        calls.append((item["name"], arguments))
    return Scan(calls, end)


def _scan_named(body: str, start: int) -> Scan | None:
    match = _NAME_CHARS.match(body, start)
    assert match is not None  # the pattern matches the empty string
    after = match.end()
    if after == len(body):
        return None if after - start <= MAX_NAME_CHARS else Scan(None, after)
    if not body.startswith(ARGS, after):
        partial = ARGS.startswith(body[after:])
        return None if partial else Scan(None, after)
    arguments_start = skip_whitespace(body, after + len(ARGS))
    if arguments_start == len(body):
        return None
    if body[arguments_start] != "{":
        return Scan(None, arguments_start)
    end = json_value_end(body, arguments_start)
    if end is None:
        return None
    arguments = arguments_object(json_or_none(body[arguments_start:end]))
    return Scan(None if arguments is None else [(body[start:after], arguments)], end)


MISTRAL = MistralFormat()
