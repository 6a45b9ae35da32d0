"""Qwen3-Coder / Qwen3.5 XML tool calls, values typed by the tool's JSON schema.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Lisbon
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

-> get_weather({"city": "Lisbon", "days": 2}). The model writes every value as bare text; the
schema says what it is (as vLLM's qwen3_coder parser does): "integer", "number", "boolean" and
"null" values are read as such, "object" and "array" values as JSON, and a value that does not
read as its type (or a parameter the schema does not name) stays the text the model wrote.
One line break after the opening tag and one before the closing tag belong to the markup.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from worker.chat.delimited_calls import Scan

START_TAG, END_TAG = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)
_INTEGER = re.compile(r"-?\d+")


@dataclass(frozen=True, slots=True)
class Qwen3XmlFormat:
    schemas: Mapping[str, Any] = field(default_factory=dict)  # function name -> parameters schema
    markers: tuple[str, ...] = (START_TAG,)
    opens_on_brace: bool = False

    def scan(self, marker: str, body: str) -> Scan | None:
        end = body.find(END_TAG)
        if end < 0:
            return None
        call = self._parse(body[:end])
        return Scan(None if call is None else [call], end + len(END_TAG))

    def _parse(self, inner: str) -> tuple[str, dict[str, Any]] | None:
        function = _FUNCTION.fullmatch(inner)
        if function is None:
            return None
        name = function[1].strip()
        properties = _properties(self.schemas.get(name))
        arguments: dict[str, Any] = {}
        position = 0
        for parameter in _PARAMETER.finditer(function[2]):
            key = parameter[1].strip()
            if function[2][position : parameter.start()].strip() or key in arguments:
                return None  # text between parameters, or a parameter given twice
            arguments[key] = coerce_value(_unwrap(parameter[2]), properties.get(key))
            position = parameter.end()
        return (name, arguments) if not function[2][position:].strip() else None


def qwen3_xml_format(schemas: Mapping[str, Any]) -> Qwen3XmlFormat:
    return Qwen3XmlFormat(schemas)


def coerce_value(text: str, schema: Any) -> Any:
    """The value the schema says `text` is; the text itself where it says string, or nothing."""
    types = schema_types(schema)
    if "string" in types or not types:
        return text
    if "null" in types and text.strip() == "null":
        return None
    for kind in ("integer", "number", "boolean", "object", "array"):
        if kind in types:
            value = _read(text.strip(), kind)
            if value is not _UNREAD:
                return value
    return text


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema allows: its "type" (one or a list) or its anyOf/oneOf members'."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    members = schema.get("anyOf") or schema.get("oneOf") or []
    return set().union(*(schema_types(member) for member in members)) if isinstance(members, list) else set()


_UNREAD = object()


def _read(text: str, kind: str) -> Any:
    if kind == "integer":
        return int(text) if _INTEGER.fullmatch(text) else _UNREAD
    if kind == "boolean":
        return {"true": True, "false": False}.get(text.lower(), _UNREAD)
    try:
        value = json.loads(text)
    except ValueError:
        return _UNREAD
    wanted: dict[str, type | tuple[type, ...]] = {"number": (int, float), "object": dict, "array": list}
    return value if isinstance(value, wanted[kind]) and not isinstance(value, bool) else _UNREAD


def _properties(schema: Any) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def _unwrap(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value
