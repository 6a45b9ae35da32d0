"""Forced tool calls as llguidance Lark grammars, one builder per model family's call format.

The worker's tool parser (worker/chat/tool_parser.py) reads the same formats back, so a forced
call always parses as a call. JSON inside a call follows the whitespace options it is given
(compact by default: shared/structured_output.py).

Worked example, one function get_weather(city: string, days: integer), not parallel:

    hermes       start: call
                 call: "<tool_call>\\n" %json {name const, arguments: the parameters} "\\n</tool_call>"
    qwen3_xml    call: "<tool_call>\\n<function=get_weather>\\n" f0_city f0_days "</function>\\n</tool_call>"
                 f0_city: /<parameter=city>\\n(...text without "</"...)\\n<\\/parameter>\\n/
                 f0_days: "<parameter=days>\\n" %json {"type": "integer"} "\\n</parameter>\\n"
    llama3_json  call: %json {name const, parameters: the parameters}
    mistral      start: "[TOOL_CALLS][" call ("," call)* "]"   call: %json {name const, arguments}

Parallel calls: `call ("\\n" call){0,7}` (llama3_json: "; " between calls), at most
`MAX_PARALLEL_CALLS`: a small model that keeps calling would otherwise write calls until its
`max_tokens`. (The worker also ends the turn at a call that repeats an earlier one.)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Literal, get_args

ToolFormat = Literal["hermes", "qwen3_xml", "llama3_json", "mistral"]
TOOL_FORMATS: tuple[str, ...] = get_args(ToolFormat)
MAX_PARALLEL_CALLS = 8  # calls in one forced turn: more than any tool loop here asks for at once
_TEXT_CHAR = r"([^<]|<[^/])"  # a bare text value's: anything up to the closing tag's "</"


_MORE_CALLS = f"{{0,{MAX_PARALLEL_CALLS - 1}}}"  # after the first call


def tool_call_lark(spec: dict[str, Any], tool_format: str, json_options: dict[str, Any]) -> str:
    """spec: {"functions": [{"name", "parameters"}], "parallel": bool}."""
    return _BUILDERS[tool_format](spec["functions"], spec["parallel"], json_options)


def _hermes(functions: list[dict[str, Any]], parallel: bool, options: dict[str, Any]) -> str:
    schema = _json_call(functions, "arguments", options)
    call = f"{json.dumps('<tool_call>' + chr(10))} %json {json.dumps(schema)} {json.dumps(chr(10) + '</tool_call>')}"
    return _start(parallel, '"\\n"') + f"call: {call}\n"


def _llama3_json(functions: list[dict[str, Any]], parallel: bool, options: dict[str, Any]) -> str:
    return _start(parallel, '"; "') + f"call: %json {json.dumps(_json_call(functions, 'parameters', options))}\n"


def _mistral(functions: list[dict[str, Any]], parallel: bool, options: dict[str, Any]) -> str:
    calls = f'call ("," call){_MORE_CALLS}' if parallel else "call"
    schema = _json_call(functions, "arguments", options)
    return f'start: "[TOOL_CALLS][" {calls} "]"\ncall: %json {json.dumps(schema)}\n'


def _qwen3_xml(functions: list[dict[str, Any]], parallel: bool, options: dict[str, Any]) -> str:
    rules = [_start(parallel, '"\\n"').rstrip("\n")]
    rules.append("call: " + " | ".join(f"f{i}" for i in range(len(functions))))
    for i, function in enumerate(functions):
        rules += _qwen3_function(f"f{i}", function, options)
    return "\n".join(rules) + "\n"


def _qwen3_function(rule: str, function: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """Required parameters in the schema's order, then each optional one, maybe."""
    parameters = function.get("parameters") or {}
    properties: dict[str, Any] = parameters.get("properties") or {}
    required = set(parameters.get("required") or ())
    head = json.dumps(f"<tool_call>\n<function={function['name']}>\n")
    body, rules = [], []
    for j, (name, schema) in enumerate(properties.items()):
        rules.append(f"{rule}_{j}: {_qwen3_parameter(name, schema, options)}")
        body.append(f"{rule}_{j}" if name in required else f"{rule}_{j}?")
    tail = json.dumps("</function>\n</tool_call>")
    return [f"{rule}: {head} {' '.join(body)} {tail}", *rules]


def _qwen3_parameter(name: str, schema: Any, options: dict[str, Any]) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    opening, closing = f"<parameter={name}>\n", "\n</parameter>\n"
    if kind in ("integer", "number", "object", "array"):
        value = f"%json {json.dumps(schema | {'x-guidance': options})}"
    elif kind == "boolean":
        value = '("true" | "false")'
    elif kind == "null":
        value = '"null"'
    elif isinstance(schema, dict) and isinstance(schema.get("enum"), list) and schema["enum"]:
        value = "(" + " | ".join(json.dumps(str(choice)) for choice in schema["enum"]) + ")"
    else:  # a string, or a type the format cannot tell: bare text, one lexeme with its tags
        pattern = _regex_literal(opening) + _string_value(schema) + _regex_literal(closing)
        return "/" + pattern.replace("/", "\\/") + "/"
    return f"{json.dumps(opening)} {value} {json.dumps(closing)}"


def _string_value(schema: Any) -> str:
    """Bare text, as long as the schema's maxLength allows (a "<" and the next character count as one)."""
    max_length = schema.get("maxLength") if isinstance(schema, dict) else None
    return _TEXT_CHAR + (f"{{0,{max_length}}}" if isinstance(max_length, int) else "*")


def _regex_literal(text: str) -> str:
    return re.escape(text).replace("\\\n", "\\n")  # a line break as the two characters "\\n"


def _start(parallel: bool, separator: str) -> str:
    return f"start: call ({separator} call){_MORE_CALLS}\n" if parallel else "start: call\n"


def _json_call(functions: list[dict[str, Any]], arguments_key: str, options: dict[str, Any]) -> dict[str, Any]:
    calls = [_call_schema(function, arguments_key) for function in functions]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    return schema | {"x-guidance": options}


def _call_schema(function: dict[str, Any], arguments_key: str) -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: parameters},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


_BUILDERS: dict[str, Callable[[list[dict[str, Any]], bool, dict[str, Any]], str]] = {
    "hermes": _hermes,
    "qwen3_xml": _qwen3_xml,
    "llama3_json": _llama3_json,
    "mistral": _mistral,
}
assert tuple(_BUILDERS) == TOOL_FORMATS
