"""Numbers in JSON grammars are bounded: llguidance, driven token by token by a writer that offers
digits for as long as the grammar takes them, stops an integer at 19 digits and a number at 17
before the point and 10 after, in schemas, json_object mode and forced calls' arguments; the
flexible form takes digits forever."""

from __future__ import annotations

from dataclasses import replace

import llguidance
import pytest

from shared.json_numbers import MAX_INT64, bounded_numbers
from shared.structured_output import StructuredOutput, json_schema_output, tool_call_output
from tests.support.tiny_models import train_tokenizer

TOKENIZER = train_tokenizer()
LL_TOKENIZER = llguidance.LLTokenizer(TOKENIZER.to_str(), eos_token=TOKENIZER.token_to_id("<|im_end|>"))
MANY = 100  # digits the writer offers before it gives up: "unbounded"
FIGURES = {
    "type": "object",
    "properties": {"n": {"type": "integer"}, "x": {"type": "number"}},
    "required": ["n", "x"],
    "additionalProperties": False,
}


def matcher(output: StructuredOutput, prefix: str) -> llguidance.LLMatcher:
    matcher = llguidance.LLMatcher(LL_TOKENIZER, output.check(), log_level=0)
    assert matcher.consume_tokens(TOKENIZER.encode(prefix, add_special_tokens=False).ids), matcher.get_error()
    return matcher


def write(matcher: llguidance.LLMatcher, text: str) -> bool:
    """Consumes `text` one character's token at a time while the grammar allows each."""
    for char in text:
        token = TOKENIZER.token_to_id(char)
        assert token is not None, f"{char!r} is a token of its own in this vocabulary"
        bitmask = matcher.compute_bitmask()
        if not bitmask[token // 8] >> (token % 8) & 1:
            return False
        assert matcher.consume_token(token)
    return True


def num_digits_taken(matcher: llguidance.LLMatcher, digit: str = "1") -> int:
    """How many digits the grammar takes in a row, up to MANY."""
    for count in range(MANY):
        if not write(matcher, digit):
            return count
    return MANY


@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_without_bounds_takes_at_most_19_digits(sign):
    output = json_schema_output(FIGURES, "response_format.json_schema")
    assert num_digits_taken(matcher(output, '{"n":' + sign)) == 19
    assert num_digits_taken(matcher(replace(output, numbers="flexible"), '{"n":' + sign)) == MANY


def test_the_int64_bound_itself_is_allowed_and_one_more_is_not():
    output = json_schema_output(FIGURES, "guided_json")
    assert write(matcher(output, '{"n":'), f"{MAX_INT64},")
    assert not write(matcher(output, '{"n":'), f"{MAX_INT64 + 1},")


def test_a_number_without_bounds_takes_17_digits_a_point_and_10_more_and_no_exponent():
    output = json_schema_output(FIGURES, "response_format.json_schema")
    lane = matcher(output, '{"n":1,"x":')
    assert num_digits_taken(lane) == 17
    assert write(lane, ".")
    assert num_digits_taken(lane) == 10
    assert not write(lane, "e")
    assert write(lane, "}")
    assert lane.is_accepting()
    flexible = matcher(replace(output, numbers="flexible"), '{"n":1,"x":1.')
    assert num_digits_taken(flexible) == MANY
    assert write(flexible, "e1")


def test_trailing_zeros_after_the_point_are_bounded_too():
    lane = matcher(json_schema_output(FIGURES, "guided_json"), '{"n":1,"x":0.')
    assert num_digits_taken(lane, "0") == 10


def test_json_object_mode_bounds_numbers_at_any_depth():
    output = StructuredOutput("json_object", "", "response_format")
    for prefix in ['{"a":', '{"a":[{"b":[', '{"a":{"b":-']:
        assert num_digits_taken(matcher(output, prefix)) == 17, prefix
        assert num_digits_taken(matcher(replace(output, numbers="flexible"), prefix)) == MANY, prefix
    assert write(matcher(output, ""), '{"a":[1,{"b":null}],"c":"x","d":true,"e":-2.5}')


@pytest.mark.parametrize(
    ("tool_format", "prefix"),
    [
        ("hermes", '<tool_call>\n{"name":"f","arguments":{"n":'),
        ("qwen3_xml", "<tool_call>\n<function=f>\n<parameter=n>\n"),
        ("llama3_json", '{"name":"f","parameters":{"n":'),
        ("mistral", '[TOOL_CALLS][{"name":"f","arguments":{"n":'),
    ],
)
def test_a_forced_calls_integer_argument_takes_at_most_19_digits(tool_format, prefix):
    forced = replace(
        tool_call_output([{"name": "f", "parameters": FIGURES}], True, "tool_choice"), tool_format=tool_format
    )
    assert num_digits_taken(matcher(forced, prefix)) == 19
    assert num_digits_taken(matcher(replace(forced, numbers="flexible"), prefix)) == MANY


def test_bounds_the_schema_has_are_kept_and_data_is_not_rewritten():
    schema = {
        "type": "object",
        "properties": {
            "type": {"type": ["integer", "null"], "minimum": 0},
            "ratio": {"type": "number", "maximum": 1, "multipleOf": 0.5},
            "tag": {"const": {"type": "integer"}},
        },
        "$defs": {"big": {"type": "integer", "exclusiveMaximum": 10}},
    }
    bounded = bounded_numbers(schema)
    assert bounded["properties"]["type"] == {"type": ["integer", "null"], "minimum": 0, "maximum": MAX_INT64}
    assert bounded["properties"]["ratio"] == {
        "type": "number",
        "maximum": 1,
        "multipleOf": 0.5,
        "exclusiveMinimum": -1e17,
    }
    assert bounded["properties"]["tag"] == {"const": {"type": "integer"}}
    assert bounded["$defs"]["big"] == {"type": "integer", "exclusiveMaximum": 10, "minimum": -MAX_INT64}


def test_a_bound_is_not_added_where_it_would_leave_no_value():
    high = {"type": "integer", "minimum": 10**20}
    assert bounded_numbers(high) == high
    assert bounded_numbers({"type": "number", "maximum": -1e18}) == {
        "type": "number",
        "maximum": -1e18,
        "multipleOf": 1e-10,
    }
    listed = {"type": "number", "const": 0.123456789012345}  # 15 digits after the point
    assert bounded_numbers(listed) == listed
    output = json_schema_output({"type": "object", "properties": {"x": listed}}, "guided_json")
    assert write(matcher(output, '{"x":'), "0.123456789012345}")
