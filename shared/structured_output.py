"""Structured outputs: what a request constrains its text to, as a grammar for llguidance.

A request names at most one constraint (`response_format` json_object or json_schema, vLLM's
`guided_json` / `guided_regex` / `guided_choice` / `guided_grammar` or `structured_outputs`, or a
forced tool call through `tool_choice`). The gateway turns it into a `StructuredOutput` and
checks that llguidance compiles it (a bad schema, regex or grammar is a 400 quoting the engine's
message, before anything is queued); the worker compiles the same grammar against its tokenizer
(worker/engine/grammar_constraint.py) and masks every row with it.

Why llguidance: it compiles JSON schemas (and refuses, by name, keywords it cannot enforce,
instead of ignoring them), regexes, Lark and GBNF grammars, needs no other package (the gateway
checks grammars without torch), and its masks cost ~15-25 us a token on the default model's
49k vocabulary on this project's CPU (xgrammar's ~2 us, but it brings triton and transformers
into the worker; either is far below a ~50 ms step). docs/API.md lists what each field takes.

JSON text is allowed whitespace between tokens, at most `MAX_WHITESPACE` characters at a time, so
a model cannot spend its whole budget on newlines inside an object.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]

MAX_WHITESPACE = 16
JSON_OPTIONS: JsonCompileOptions = {"whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{0,{MAX_WHITESPACE}}}"}
TOOL_CALL_START = "<tool_call>"  # the Hermes/Qwen format worker/chat/tool_calls.py parses
TOOL_CALL_END = "</tool_call>"


class StructuredOutputError(ValueError):
    """A constraint the grammar engine refuses; the message names the field and quotes the engine."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class StructuredOutput:
    kind: Kind
    spec: str  # the schema's JSON, the regex, the choices' JSON list, the grammar; "" for json_object
    field: str  # the request field it came from, for error messages

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form), uncompiled; `check` says whether it compiles."""
        import llguidance

        if self.kind == "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self.spec, defaults=JSON_OPTIONS)
        if self.kind == "tool_call":
            return llguidance.LLMatcher.grammar_from_lark(_tool_call_lark(json.loads(self.spec)))
        if self.kind == "choice":
            choices = json.loads(self.spec)
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        return llguidance.grammar_from(self.kind, self.spec)

    def check(self) -> str:
        """The grammar, once llguidance has compiled it; StructuredOutputError otherwise. Cached
        by (kind, spec): a schema sent again costs a dict lookup, not a compile."""
        grammar, error = _checked(self)
        if error is not None:
            raise StructuredOutputError(self.field, error)
        assert grammar is not None
        return grammar


@functools.lru_cache(maxsize=256)
def _checked(output: StructuredOutput) -> tuple[str | None, str | None]:
    """(grammar, None) or (None, the engine's message). The field is part of the key, so a
    message always names the field of the request it answers."""
    import llguidance

    try:
        grammar = output.grammar()
    except ValueError as error:  # not JSON, or a GBNF grammar that does not convert
        return None, str(error)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    return (None, messages[0].strip()) if is_error else (grammar, None)


def json_schema_output(schema: Any, field: str) -> StructuredOutput:
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as error:
            raise StructuredOutputError(field, f"is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise StructuredOutputError(field, "must be a JSON schema object")
    return StructuredOutput("json_schema", json.dumps(schema), field)


def choice_output(choices: list[str], field: str) -> StructuredOutput:
    if not choices or not all(isinstance(choice, str) and choice for choice in choices):
        raise StructuredOutputError(field, "must be a non-empty list of non-empty strings")
    return StructuredOutput("choice", json.dumps(choices), field)


def tool_call_output(functions: list[dict[str, Any]], parallel: bool, field: str) -> StructuredOutput:
    """A forced call of one of `functions` ({"name", "parameters"}), arguments by its schema;
    several calls in a row when `parallel`."""
    spec = {"functions": [{"name": f["name"], "parameters": f.get("parameters")} for f in functions]}
    return StructuredOutput("tool_call", json.dumps(spec | {"parallel": parallel}), field)


def _tool_call_lark(spec: dict[str, Any]) -> str:
    """Worked example, one function `get_weather(city: string)`, not parallel:

        start: call
        call: "<tool_call>\\n" %json {"type": "object", "properties": {"name": {"const": "get_weather"},
              "arguments": {...its parameters...}}, "required": ["name", "arguments"], ...} "\\n</tool_call>"

    With several functions the object is an `anyOf` of one such object per function; parallel
    calls are `call ("\\n" call)*`, the way Hermes templates write them.
    """
    calls = [_call_schema(function) for function in spec["functions"]]
    schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
    schema = schema | {"x-guidance": JSON_OPTIONS}
    start = 'call ("\\n" call)*' if spec["parallel"] else "call"
    opening, closing = json.dumps(TOOL_CALL_START + "\n"), json.dumps("\n" + TOOL_CALL_END)
    return f"start: {start}\ncall: {opening} %json {json.dumps(schema)} {closing}\n"


def _call_schema(function: dict[str, Any]) -> dict[str, Any]:
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }
