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

Whitespace in JSON is bounded: by default none between tokens, with compact separators ("," and
":"), so a small model cannot spend its budget on runs of newlines between keys (vLLM's
`disable-any-whitespace`). The flexible form (ARBOR_JSON_WHITESPACE=flexible) allows up to
`MAX_WHITESPACE` characters at each place JSON allows whitespace; the number of such places is
not bounded, which is why it is not the default.

Numbers in JSON are bounded the same way (shared/json_numbers.py): by default an integer has at
most 19 digits (int64) and a number at most 17 digits before the point and 10 after it;
ARBOR_JSON_NUMBERS=flexible leaves them unbounded, as the schema says.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from shared.json_numbers import JsonNumbers, bounded_json_object, bounded_numbers
from shared.tool_call_grammar import tool_call_lark

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

Kind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]

JsonWhitespace = Literal["compact", "flexible"]
MAX_WHITESPACE = 16
COMPACT_JSON: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
FLEXIBLE_JSON: JsonCompileOptions = {"whitespace_pattern": rf"[\x20\x0A\x0D\x09]{{0,{MAX_WHITESPACE}}}"}
JSON_OPTIONS: dict[JsonWhitespace, JsonCompileOptions] = {"compact": COMPACT_JSON, "flexible": FLEXIBLE_JSON}


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
    # Set by the worker from its settings and its model. The gateway checks the defaults: the same
    # schemas in other punctuation, so a constraint that passes there compiles on the worker too
    # (where one did not, the job would fail with an error naming the field, never a 500).
    tool_format: str = "hermes"  # a forced call's format (shared/tool_call_grammar.py)
    whitespace: JsonWhitespace = "compact"
    numbers: JsonNumbers = "bounded"  # shared/json_numbers.py

    def grammar(self) -> str:
        """The llguidance grammar (its JSON form), uncompiled; `check` says whether it compiles."""
        import llguidance

        options = JSON_OPTIONS[self.whitespace]
        if self.kind == "json_object" or self.kind == "json_schema":
            return llguidance.LLMatcher.grammar_from_json_schema(self._schema(), defaults=options)
        if self.kind == "tool_call":
            lark = tool_call_lark(self._tool_spec(), self.tool_format, dict(options))
            return llguidance.LLMatcher.grammar_from_lark(lark)
        if self.kind == "choice":
            choices = json.loads(self.spec)
            return llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in choices))
        return llguidance.grammar_from(self.kind, self.spec)

    def _schema(self) -> Any:
        bounded = self.numbers == "bounded"
        if self.kind == "json_object":
            return bounded_json_object() if bounded else {"type": "object"}
        schema = json.loads(self.spec)
        return bounded_numbers(schema) if bounded else schema

    def _tool_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(self.spec)
        if self.numbers == "bounded":
            spec["functions"] = [f | {"parameters": bounded_numbers(f["parameters"])} for f in spec["functions"]]
        return spec

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
