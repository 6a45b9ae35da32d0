"""A forced turn's parser ends at a repeated call: in every format, at every step size, the calls
before the repeat stream and finish as they would alone, the repeat never shows (nor the
separators around calls, as content), and a call that only starts like an earlier one streams whole."""

import json

import pytest

from tests.worker.chat.test_tool_parsers import SCHEMAS, STEP_SIZES, token_steps
from worker.chat.forced_calls import ForcedCalls
from worker.chat.tool_parser import make_tool_parser

LISBON = ("get_weather", {"city": "Lisbon", "days": 2})
LISBON_LONGER = ("get_weather", {"city": "Lisbon", "days": 20})  # starts as LISBON's text does
OSLO = ("search", {"query": "Oslo"})


def written(tool_format: str, calls: list[tuple[str, dict]]) -> str:
    """The calls as a model writes them in `tool_format`, compact JSON as the forced grammar writes it."""
    bodies = [json.dumps({"name": name, "arguments": args}, separators=(",", ":")) for name, args in calls]
    if tool_format == "hermes":
        return "\n".join(f"<tool_call>\n{body}\n</tool_call>" for body in bodies)
    if tool_format == "qwen3_xml":
        return "\n".join(_xml_call(name, args) for name, args in calls)
    if tool_format == "mistral":
        return "[TOOL_CALLS][" + ",".join(bodies) + "]"
    return "; ".join(body.replace('"arguments"', '"parameters"') for body in bodies)  # llama3_json


def _xml_call(name: str, args: dict) -> str:
    parameters = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in args.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


def run(tool_format: str, steps: list[str]) -> tuple[str, list[tuple[str, dict]], list[tuple[str, dict]], bool]:
    """(content, calls rebuilt from the streamed deltas, finish(), done) of a ForcedCalls parser."""
    parser = ForcedCalls(make_tool_parser(tool_format, SCHEMAS))
    deltas = []
    for step in steps:
        if parser.done:
            break  # as LaneOutput does: what follows the end is not output
        deltas.append(parser.feed(step))
    deltas.append(parser.flush())
    streamed: dict[int, list[str]] = {}
    for delta in deltas:
        for d in delta.tool_calls:
            call = streamed.setdefault(d["index"], ["", ""])
            call[0] += d.get("function", {}).get("name") or ""
            call[1] += d.get("function", {}).get("arguments") or ""
    rebuilt = [(name, json.loads(args)) for name, args in (streamed[i] for i in sorted(streamed))]
    finished = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parser.finish()]
    return "".join(d.content for d in deltas), rebuilt, finished, parser.done


FORMATS = ["hermes", "qwen3_xml", "llama3_json", "mistral"]


@pytest.mark.parametrize("num_tokens", [None, *STEP_SIZES])
@pytest.mark.parametrize("tool_format", FORMATS)
def test_the_turn_ends_at_a_repeated_call_which_never_streams(tool_format, num_tokens):
    text = written(tool_format, [LISBON, LISBON_LONGER, OSLO, LISBON, OSLO])
    steps = [text] if num_tokens is None else token_steps(text, num_tokens)
    content, streamed, finished, done = run(tool_format, steps)
    assert done
    assert streamed == finished == [LISBON, LISBON_LONGER, OSLO]
    assert content == ""  # neither the repeat nor the separators before it


@pytest.mark.parametrize("num_tokens", [None, *STEP_SIZES])
@pytest.mark.parametrize("tool_format", FORMATS)
def test_calls_that_do_not_repeat_stream_as_the_plain_parser_streams_them(tool_format, num_tokens):
    text = written(tool_format, [LISBON, LISBON_LONGER, OSLO])
    steps = [text] if num_tokens is None else token_steps(text, num_tokens)
    content, streamed, finished, done = run(tool_format, steps)
    assert streamed == finished == [LISBON, LISBON_LONGER, OSLO]
    assert content == ""
    assert not done or tool_format == "mistral"  # the array closed: mistral's parser may know it is over


def test_a_call_that_may_still_repeat_streams_nothing_until_it_diverges():
    parser = ForcedCalls(make_tool_parser("hermes", SCHEMAS))
    first = written("hermes", [LISBON])
    assert [d["index"] for d in parser.feed(first).tool_calls] == [0, 0]
    assert parser.feed('\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Lisbon","days":2').tool_calls == []
    diverged = parser.feed("0}}").tool_calls  # '"days":20': not call 0's text any more
    assert [d["index"] for d in diverged] == [1, 1, 1]
    assert "".join(d["function"].get("arguments", "") for d in diverged) == '{"city":"Lisbon","days":20}'


def test_a_held_call_cut_short_goes_out_at_the_end_as_the_plain_parser_sends_it():
    parser = ForcedCalls(make_tool_parser("hermes", SCHEMAS))
    parser.feed(written("hermes", [LISBON]) + '\n<tool_call>\n{"name":"get_weather","arguments":{"city"')
    end = parser.flush()
    assert [d["index"] for d in end.tool_calls] == [1, 1]
    assert end.content.startswith("<tool_call>")
    assert [c["function"]["name"] for c in parser.finish()] == ["get_weather"]
