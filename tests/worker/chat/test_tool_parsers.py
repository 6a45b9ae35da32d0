"""Every tool-call format: canonical calls, fed whole and at 1, 2, 3, 5 and 8 tokens a step,
typed values, text around calls, several calls, malformed calls, and the template rule."""

import functools
import itertools
import json
from pathlib import Path

import pytest

from tests.support.tiny_models import train_tokenizer
from worker.chat.qwen3_xml import coerce_value
from worker.chat.tool_parser import TOOL_PARSERS, choose_tool_parser, make_tool_parser

SCHEMAS = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "celsius": {"type": "boolean"},
            "hours": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "search": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": ["integer", "null"]}}},
}
WEATHER = ("get_weather", {"city": "Lisbon", "days": 2, "celsius": True, "hours": [9, 18]})
SEARCH = ("search", {"query": "a < b </ c", "limit": None})

QWEN_WEATHER = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nLisbon\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
    "<parameter=celsius>\ntrue\n</parameter>\n<parameter=hours>\n[9, 18]\n</parameter>\n</function>\n</tool_call>"
)
QWEN_SEARCH = (
    "<tool_call>\n<function=search>\n<parameter=query>\na < b </ c\n</parameter>\n"
    "<parameter=limit>\nnull\n</parameter>\n</function>\n</tool_call>"
)
HERMES_WEATHER = '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(WEATHER[1]) + "}\n</tool_call>"
HERMES_SEARCH = '<tool_call>\n{"name": "search", "arguments": ' + json.dumps(SEARCH[1]) + "}\n</tool_call>"
LLAMA_WEATHER = '{"name": "get_weather", "parameters": ' + json.dumps(WEATHER[1]) + "}"
LLAMA_SEARCH = '{"name": "search", "arguments": ' + json.dumps(SEARCH[1]) + "}"
MISTRAL_BOTH = "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in (WEATHER, SEARCH)])
MISTRAL_NAMED = (
    "[TOOL_CALLS]get_weather[ARGS]" + json.dumps(WEATHER[1]) + "[TOOL_CALLS]search[ARGS]" + json.dumps(SEARCH[1])
)

# (format, text, content, calls)
CASES = [
    ("hermes", HERMES_WEATHER, "", [WEATHER]),
    ("hermes", "Let me check.\n" + HERMES_WEATHER + "\n" + HERMES_SEARCH, "Let me check.\n\n", [WEATHER, SEARCH]),
    ("qwen3_xml", QWEN_WEATHER, "", [WEATHER]),
    ("qwen3_xml", "Let me check.\n" + QWEN_WEATHER + "\n" + QWEN_SEARCH, "Let me check.\n\n", [WEATHER, SEARCH]),
    ("llama3_json", LLAMA_WEATHER, "", [WEATHER]),
    ("llama3_json", "<|python_tag|>" + LLAMA_WEATHER + "; " + LLAMA_SEARCH, "", [WEATHER, SEARCH]),
    ("llama3_json", "Let me check.<|python_tag|>" + LLAMA_WEATHER, "Let me check.", [WEATHER]),
    ("mistral", MISTRAL_BOTH, "", [WEATHER, SEARCH]),
    ("mistral", "Let me check." + MISTRAL_NAMED, "Let me check.", [WEATHER, SEARCH]),
]
MALFORMED = [
    ("hermes", "<tool_call>\n{not json}\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nLisbon\n</function>\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\nget_weather(city=Lisbon)\n</tool_call>"),
    ("qwen3_xml", "<tool_call>\n<function=get_weather>\n<parameter=city>\nLisbon\n</parameter>\n"),  # never closed
    ("llama3_json", '{"name": "get_weather", "parameters": [1, 2]}'),
    ("llama3_json", '{"city": "Lisbon"}'),
    ("mistral", "[TOOL_CALLS][{'name': 'get_weather'}]"),
    ("mistral", "[TOOL_CALLS]get weather[ARGS]{}"),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": '),  # never closed
]
STEP_SIZES = [1, 2, 3, 5, 8]


@functools.cache
def tokenizer():
    return train_tokenizer()


def token_steps(text: str, num_tokens: int) -> list[str]:
    """The text as a model emits it: token by token, `num_tokens` tokens a step."""
    pieces = [tokenizer().decode([token]) for token in tokenizer().encode(text).ids]
    assert "".join(pieces) == text
    return ["".join(pieces[i : i + num_tokens]) for i in range(0, len(pieces), num_tokens)]


def run(tool_format: str, steps: list[str]) -> tuple[str, list[dict], list[dict]]:
    """(content, calls rebuilt from the streamed deltas as an OpenAI client does, finish())."""
    parser = make_tool_parser(tool_format, SCHEMAS)
    deltas = [parser.feed(step) for step in steps] + [parser.flush()]
    calls: dict[int, dict] = {}
    for delta in deltas:
        assert len({d["index"] for d in delta.tool_calls}) == len(delta.tool_calls) or tool_format == "hermes"
        for d in delta.tool_calls:
            call = calls.setdefault(d["index"], {"name": "", "arguments": ""})
            call["name"] += d.get("function", {}).get("name") or ""
            call["arguments"] += d.get("function", {}).get("arguments") or ""
    return "".join(d.content for d in deltas), [calls[i] for i in sorted(calls)], parser.finish()


def named(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c.get("function", c)["name"], json.loads(c.get("function", c)["arguments"])) for c in calls]


@pytest.mark.parametrize(("tool_format", "text", "content", "calls"), CASES)
def test_whole_text_gives_the_calls_and_the_content_around_them(tool_format, text, content, calls):
    got_content, streamed, finished = run(tool_format, [text])
    assert got_content == content
    assert named(finished) == calls
    assert named(streamed) == calls


@pytest.mark.parametrize("num_tokens", STEP_SIZES)
@pytest.mark.parametrize(("tool_format", "text", "content", "calls"), CASES)
def test_any_step_size_gives_what_the_whole_text_gives(tool_format, text, content, calls, num_tokens):
    whole = run(tool_format, [text])
    stepped = run(tool_format, token_steps(text, num_tokens))
    assert stepped[0] == whole[0]
    assert stepped[1] == whole[1]
    assert [c["function"] for c in stepped[2]] == [c["function"] for c in whole[2]]


@pytest.mark.parametrize("num_tokens", [None, *STEP_SIZES])
@pytest.mark.parametrize(("tool_format", "text"), MALFORMED)
def test_a_malformed_call_is_content_exactly_as_written(tool_format, text, num_tokens):
    steps = [text] if num_tokens is None else token_steps(text, num_tokens)
    content, streamed, finished = run(tool_format, steps)
    assert (content, finished) == (text, [])


def test_a_single_call_parser_stops_after_its_call():
    parser = make_tool_parser("qwen3_xml", SCHEMAS, max_calls=1)
    parser.feed(QWEN_WEATHER + "\n" + QWEN_SEARCH)
    assert parser.done
    assert named(parser.finish()) == [WEATHER]


@pytest.mark.parametrize(
    ("text", "schema", "value"),
    [
        ("42", {"type": "integer"}, 42),
        ("-7", {"type": "integer"}, -7),
        ("4.5", {"type": "integer"}, "4.5"),  # not an integer: the text as written
        ("4.5", {"type": "number"}, 4.5),
        ("3", {"type": "number"}, 3),
        ("True", {"type": "boolean"}, True),
        ("false", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ("null", {"type": "null"}, None),
        ("null", {"type": ["string", "null"]}, "null"),  # a string may read "null"
        ("null", {"anyOf": [{"type": "integer"}, {"type": "null"}]}, None),
        ('{"a": [1]}', {"type": "object"}, {"a": [1]}),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ("[1, 2]", {"type": "object"}, "[1, 2]"),
        ("  Lisbon ", {"type": "string"}, "  Lisbon "),
        ("12", {"type": "string"}, "12"),
        ("12", None, "12"),  # a parameter the schema does not name stays text
    ],
)
def test_a_value_is_read_as_its_schema_type(text, schema, value):
    got = coerce_value(text, schema)
    assert got == value and type(got) is type(value)


def test_a_call_after_the_think_block_is_parsed():
    from worker.serving.lane_output import LaneOutput, OutputOptions, ReasoningOptions

    text = "<think>\nI should call <tool_call> it.\n</think>\n\n" + QWEN_WEATHER
    ids = tokenizer().encode(text).ids
    options = OutputOptions(
        reasoning=ReasoningOptions(), parse_tool_calls=True, tool_parser="qwen3_xml", tool_schemas=SCHEMAS
    )
    output = LaneOutput(tokenizer(), options, [])
    deltas = [output.add(ids[i : i + 3]) for i in range(0, len(ids), 3)] + [output.finish()]
    assert "".join(d.reasoning for d in deltas) == "\nI should call <tool_call> it.\n"
    assert "".join(d.text for d in deltas).strip() == ""
    assert output.made_tool_calls
    calls = [c for d in deltas for c in d.tool_calls]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [WEATHER]


TEMPLATES = Path(__file__).parent / "templates"


@pytest.mark.parametrize(
    ("template", "parser"),
    [
        ((TEMPLATES / "qwen3.jinja").read_text(), "hermes"),
        ((TEMPLATES / "hermes3_tool_use.jinja").read_text(), "hermes"),
        ((TEMPLATES / "llama3_1.jinja").read_text(), "llama3_json"),
        ((TEMPLATES / "qwen3_5_xml.jinja").read_text(), "qwen3_xml"),
        ("{{ '[AVAILABLE_TOOLS]' }}{{ '[TOOL_CALLS]' }}", "mistral"),
        ("{{ messages[0].content }}", "hermes"),
        (None, "hermes"),
    ],
)
def test_the_parser_is_the_one_the_template_asks_for(template, parser):
    assert choose_tool_parser(template)[0] == parser


def test_every_format_has_a_parser_and_a_forced_call_grammar():
    from shared.tool_call_grammar import TOOL_FORMATS

    assert tuple(TOOL_PARSERS) == TOOL_FORMATS


def test_ids_differ_between_calls():
    _, _, finished = run("mistral", [MISTRAL_BOTH])
    assert len({call["id"] for call in finished}) == 2
    assert list(itertools.chain.from_iterable(c["id"].split("_")[:1] for c in finished)) == ["call", "call"]


def test_the_choice_is_logged_and_an_override_wins(caplog):
    from worker.serving_model import _tool_parser

    xml = (TEMPLATES / "qwen3_5_xml.jinja").read_text()
    with caplog.at_level("INFO", logger="worker.serving_model"):
        assert _tool_parser(None, xml) == "qwen3_xml"
        assert _tool_parser("hermes", xml) == "hermes"
    assert "tool-call format: qwen3_xml (the chat template writes <function= and <parameter=)" in caplog.text
    assert "tool-call format: hermes (set by ARBOR_TOOL_PARSER / --tool-parser)" in caplog.text
    with pytest.raises(ValueError, match="tool_parser: 'xml' is not one of hermes, qwen3_xml"):
        _tool_parser("xml", xml)


@pytest.mark.parametrize(("tool_format", "text"), MALFORMED)
def test_a_lane_with_a_malformed_call_made_no_call_and_keeps_the_text(tool_format, text):
    from worker.serving.lane_output import LaneOutput, OutputOptions

    options = OutputOptions(parse_tool_calls=True, tool_parser=tool_format, tool_schemas=SCHEMAS)
    output = LaneOutput(tokenizer(), options, [])
    ids = tokenizer().encode(text).ids
    deltas = [output.add(ids[i : i + 2]) for i in range(0, len(ids), 2)] + [output.finish()]
    assert "".join(d.text for d in deltas) == text
    assert not output.made_tool_calls and not any(d.tool_calls for d in deltas)
