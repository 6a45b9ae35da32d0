"""Constraints to grammars: what llguidance compiles, and what it refuses with its own message."""

from __future__ import annotations

import json

import llguidance
import pytest

from shared.structured_output import (
    StructuredOutput,
    StructuredOutputError,
    choice_output,
    json_schema_output,
    tool_call_output,
)
from tests.support.tiny_models import train_tokenizer

TOKENIZER = train_tokenizer()
LL_TOKENIZER = llguidance.LLTokenizer(TOKENIZER.to_str(), eos_token=TOKENIZER.token_to_id("<|im_end|>"))
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def accepts(output: StructuredOutput, text: str) -> bool:
    """Whether the grammar accepts `text` whole, as a small byte-level BPE tokenizes it."""
    matcher = llguidance.LLMatcher(LL_TOKENIZER, output.check(), log_level=0)
    ids = TOKENIZER.encode(text, add_special_tokens=False).ids
    return matcher.consume_tokens(ids) and matcher.is_accepting()


@pytest.mark.parametrize(
    ("output", "good", "bad"),
    [
        (StructuredOutput("json_object", "", "response_format"), '{"a": [1, 2]}', "[1, 2]"),
        (json_schema_output(WEATHER, "response_format.json_schema"), '{"city": "Oslo"}', '{"town": "Oslo"}'),
        (json_schema_output(json.dumps(WEATHER), "guided_json"), '{"city":"Oslo"}', '{"city": 3}'),
        (StructuredOutput("regex", r"\d{3}-\d{4}", "guided_regex"), "555-1234", "555-12345"),
        (choice_output(["yes", "no"], "guided_choice"), "no", "maybe"),
        (StructuredOutput("grammar", 'root ::= "a" root | "b"', "guided_grammar"), "aab", "aba"),
        (StructuredOutput("grammar", 'start: "x"+ "y"', "guided_grammar"), "xxy", "y"),
        (
            tool_call_output([{"name": "get_weather", "parameters": WEATHER}], False, "tool_choice"),
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
        ),
    ],
)
def test_each_kind_compiles_and_accepts_what_it_should(output, good, bad):
    assert accepts(output, good)
    assert not accepts(output, bad)


def test_parallel_tool_calls_allow_several_calls_and_one_call_only_otherwise():
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    functions = [{"name": "get_weather", "parameters": WEATHER}, {"name": "noop"}]
    noop = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    assert accepts(tool_call_output(functions, True, "tool_choice"), f"{call}\n{noop}")
    assert not accepts(tool_call_output(functions, False, "tool_choice"), f"{call}\n{noop}")
    assert accepts(tool_call_output(functions, False, "tool_choice"), noop)


@pytest.mark.parametrize(
    ("output", "message"),
    [
        (json_schema_output({"type": "nonsense"}, "response_format.json_schema.schema"), "Invalid type: nonsense"),
        (json_schema_output({"type": "array", "uniqueItems": True}, "guided_json"), "Unimplemented keys"),
        (json_schema_output({"$ref": "#/$defs/missing"}, "guided_json"), "does not exist"),
        (StructuredOutput("regex", "a(b", "guided_regex"), "unclosed group"),
        (StructuredOutput("grammar", "root ::= undefined", "guided_grammar"), "undefined"),
        (StructuredOutput("grammar", "start: nothing", "guided_grammar"), "unknown name"),
    ],
)
def test_what_the_engine_refuses_is_an_error_naming_the_field_and_quoting_it(output, message):
    with pytest.raises(StructuredOutputError, match=message) as caught:
        output.check()
    assert caught.value.field == output.field and str(caught.value).startswith(f"{output.field}: ")


def test_a_schema_that_is_not_json_or_not_an_object_is_refused_by_name():
    with pytest.raises(StructuredOutputError, match="guided_json: is not valid JSON"):
        json_schema_output("{nope", "guided_json")
    with pytest.raises(StructuredOutputError, match="must be a JSON schema object"):
        json_schema_output([1], "guided_json")
    with pytest.raises(StructuredOutputError, match="non-empty list"):
        choice_output([], "guided_choice")
