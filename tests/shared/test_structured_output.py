"""Constraints to grammars: what llguidance compiles, and what it refuses with its own message."""

from __future__ import annotations

import json
from dataclasses import replace

import llguidance
import pytest

from shared.structured_output import (
    StructuredOutput,
    StructuredOutputError,
    choice_output,
    json_schema_output,
    tool_call_output,
)
from shared.tool_call_grammar import MAX_PARALLEL_CALLS, TOOL_FORMATS
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
        (StructuredOutput("json_object", "", "response_format"), '{"a":[1,2]}', "[1,2]"),
        (json_schema_output(WEATHER, "response_format.json_schema"), '{"city":"Oslo"}', '{"town":"Oslo"}'),
        (json_schema_output(json.dumps(WEATHER), "guided_json"), '{"city":"Oslo"}', '{"city":3}'),
        (StructuredOutput("regex", r"\d{3}-\d{4}", "guided_regex"), "555-1234", "555-12345"),
        (choice_output(["yes", "no"], "guided_choice"), "no", "maybe"),
        (StructuredOutput("grammar", 'root ::= "a" root | "b"', "guided_grammar"), "aab", "aba"),
        (StructuredOutput("grammar", 'start: "x"+ "y"', "guided_grammar"), "xxy", "y"),
        (
            tool_call_output([{"name": "get_weather", "parameters": WEATHER}], False, "tool_choice"),
            '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>',
            '<tool_call>\n{"name":"get_time","arguments":{}}\n</tool_call>',
        ),
    ],
)
def test_each_kind_compiles_and_accepts_what_it_should(output, good, bad):
    assert accepts(output, good)
    assert not accepts(output, bad)


TRIP = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("text", ['{"city": "Lisbon","days":2}', '{"city":"Lisbon","days":' + " " * 100 + "2}"])
def test_compact_json_allows_no_whitespace_between_tokens(text):
    output = json_schema_output(TRIP, "response_format.json_schema")
    assert accepts(output, '{"city":"Lisbon","days":2}')
    assert not accepts(output, text)
    forced = tool_call_output([{"name": "trip", "parameters": TRIP}], False, "tool_choice")
    assert not accepts(forced, '<tool_call>\n{"name":"trip","arguments":' + text + "}\n</tool_call>")


def test_flexible_json_allows_bounded_runs_of_whitespace():
    output = replace(json_schema_output(TRIP, "guided_json"), whitespace="flexible")
    assert accepts(output, '{ "city": "Lisbon",\n  "days": 2 }')
    assert accepts(output, '{"city":"Lisbon","days":' + " " * 16 + "2}")
    assert not accepts(output, '{"city":"Lisbon","days":' + " " * 17 + "2}")


# A forced call in each format, as the worker's parser for that format reads it back.
FORCED_CALLS = {
    "hermes": '<tool_call>\n{"name":"trip","arguments":{"city":"Lisbon","days":2}}\n</tool_call>',
    "qwen3_xml": "<tool_call>\n<function=trip>\n<parameter=city>\nLisbon\n</parameter>\n"
    "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name":"trip","parameters":{"city":"Lisbon","days":2}}',
    "mistral": '[TOOL_CALLS][{"name":"trip","arguments":{"city":"Lisbon","days":2}}]',
}


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_a_forced_call_is_written_in_the_format_and_parses_as_that_call(tool_format):
    from worker.chat.tool_parser import make_tool_parser

    output = replace(
        tool_call_output([{"name": "trip", "parameters": TRIP}], True, "tool_choice"), tool_format=tool_format
    )
    text = FORCED_CALLS[tool_format]
    assert accepts(output, text)
    assert not accepts(output, text.replace("Lisbon", "Lis</bon" if tool_format == "qwen3_xml" else 'Lisbon"'))
    assert not accepts(output, text.replace("2", "two"))
    parser = make_tool_parser(tool_format, {"trip": TRIP})
    parser.feed(text)
    parser.flush()
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parser.finish()]
    assert calls == [("trip", {"city": "Lisbon", "days": 2})]


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_flexible_whitespace_reaches_the_json_inside_forced_calls(tool_format):
    forced = tool_call_output([{"name": "trip", "parameters": TRIP}], False, "tool_choice")
    compact = replace(forced, tool_format=tool_format)
    flexible = replace(compact, whitespace="flexible")
    text = FORCED_CALLS[tool_format]
    spaced = text.replace('"city":', '"city":  ') if tool_format != "qwen3_xml" else text
    assert accepts(flexible, spaced)
    assert accepts(compact, spaced) is (spaced == text)


def test_qwen3_xml_forced_call_leaves_out_optional_parameters_and_types_the_rest():
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "hot": {"type": "boolean"}, "hours": {"type": "array"}},
        "required": ["city"],
    }
    output = replace(
        tool_call_output([{"name": "f", "parameters": schema}], False, "tool_choice"), tool_format="qwen3_xml"
    )
    head, tail = "<tool_call>\n<function=f>\n<parameter=city>\nmulti\nline\n</parameter>\n", "</function>\n</tool_call>"
    assert accepts(output, head + tail)
    assert accepts(
        output, head + "<parameter=hot>\ntrue\n</parameter>\n<parameter=hours>\n[1,2]\n</parameter>\n" + tail
    )
    assert not accepts(output, head + "<parameter=hot>\nyes\n</parameter>\n" + tail)
    assert not accepts(output, head + "<parameter=hours>\n[1, 2]\n</parameter>\n" + tail)
    assert not accepts(output, "<tool_call>\n<function=f>\n" + tail)  # city is required


def test_parallel_tool_calls_allow_several_calls_and_one_call_only_otherwise():
    call = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Oslo"}}\n</tool_call>'
    functions = [{"name": "get_weather", "parameters": WEATHER}, {"name": "noop"}]
    noop = '<tool_call>\n{"name":"noop","arguments":{}}\n</tool_call>'
    assert accepts(tool_call_output(functions, True, "tool_choice"), f"{call}\n{noop}")
    assert not accepts(tool_call_output(functions, False, "tool_choice"), f"{call}\n{noop}")
    assert accepts(tool_call_output(functions, False, "tool_choice"), noop)


def repeated_calls(tool_format: str, num_calls: int) -> str:
    """FORCED_CALLS' call `num_calls` times in a row, with the format's separators."""
    one = FORCED_CALLS[tool_format]
    if tool_format == "mistral":
        body = one.removeprefix("[TOOL_CALLS][").removesuffix("]")
        return "[TOOL_CALLS][" + ",".join([body] * num_calls) + "]"
    return ("; " if tool_format == "llama3_json" else "\n").join([one] * num_calls)


@pytest.mark.parametrize("tool_format", TOOL_FORMATS)
def test_parallel_forced_calls_stop_at_max_parallel_calls(tool_format):
    output = replace(
        tool_call_output([{"name": "trip", "parameters": TRIP}], True, "tool_choice"), tool_format=tool_format
    )
    assert accepts(output, repeated_calls(tool_format, MAX_PARALLEL_CALLS))
    assert not accepts(output, repeated_calls(tool_format, MAX_PARALLEL_CALLS + 1))


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
