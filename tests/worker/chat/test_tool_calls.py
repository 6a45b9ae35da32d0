import itertools
import json
import re

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support.fuzz import fuzz_examples
from worker.chat.tool_calls import END_TAG, START_TAG, ToolCallParser

EXAMPLE = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

# Bodies that are not a call; each goes back to content, tags included.
MALFORMED_BODIES = [
    "not json",
    '{"name": get_weather}',
    '{"arguments": {"a": 1}}',  # no name
    '{"name": "f", "arguments": [1, 2]}',  # arguments not an object
    '{"name": "f", "arguments": {"a": }}',  # breaks after the name already streamed
    '{"name": "f"} trailing',
    '{"name": "f", "name": "g"}',  # the streamed name would not be the parsed one
    '{"name": "f", "arguments": {"a": 1}, "arguments": {"b": 2}}',  # nor the streamed arguments
]


def counting_ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter):024x}"


def run(chunks: list[str]):
    parser = ToolCallParser(new_call_id=counting_ids())
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.flush()]
    content = "".join(d.content for d in deltas)
    return content, aggregate(deltas), parser.finish()


def aggregate(deltas) -> list[dict]:
    """Rebuild calls from streaming deltas the way an OpenAI client does."""
    calls: dict[int, dict] = {}
    for delta in deltas:
        for call in delta.tool_calls:
            if "id" in call:
                assert call["index"] not in calls
                assert call["function"]["arguments"] == ""
                calls[call["index"]] = {"id": call["id"], "type": call["type"], "function": dict(call["function"])}
            else:
                assert set(call) == {"index", "function"} and set(call["function"]) == {"arguments"}
                calls[call["index"]]["function"]["arguments"] += call["function"]["arguments"]
    assert sorted(calls) == list(range(len(calls)))
    return [calls[i] for i in range(len(calls))]


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def test_example_gives_content_and_one_streamed_call():
    parser = ToolCallParser()
    delta = parser.feed(EXAMPLE)
    assert delta.content == "Sure."
    first, *rest = delta.tool_calls
    assert re.fullmatch(r"call_[0-9a-f]{24}", first["id"])
    assert first == {
        "index": 0,
        "id": first["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert "".join(d["function"]["arguments"] for d in rest) == '{"city": "Paris"}'
    assert parser.flush().content == ""
    assert parser.finish() == [
        {"id": first["id"], "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]


def test_single_characters_stream_arguments_before_the_call_closes():
    parser = ToolCallParser(new_call_id=counting_ids())
    deltas = [parser.feed(c) for c in EXAMPLE[: EXAMPLE.index("Paris") + 3]]
    calls = aggregate(deltas)
    assert calls[0]["function"] == {"name": "get_weather", "arguments": '{"city": "Par'}
    assert parser.finish() == []  # not closed yet
    assert "".join(d.content for d in deltas) == "Sure."


def test_several_calls_get_consecutive_indices_and_text_after_calls_is_content():
    text = (
        'A<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
        '<tool_call>{"arguments": {"x": 1}, "name": "b"}</tool_call>'
        '<tool_call>{"name": "c"}</tool_call> done'
    )
    content, streamed, finished = run(list(text))
    assert content == "A\n done"
    assert [c["function"]["name"] for c in finished] == ["a", "b", "c"]
    assert [c["function"]["arguments"] for c in finished] == ["{}", '{"x": 1}', "{}"]
    assert streamed == finished


def test_with_max_calls_the_parser_is_done_at_the_last_call_and_drops_what_follows():
    text = 'A<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b"}</tool_call> done'
    parser = ToolCallParser(max_calls=1)
    delta = parser.feed(text)  # all at once: the newline after the close arrives with it
    assert parser.done and delta.content == "A" and parser.flush().content == ""
    assert [c["function"]["name"] for c in parser.finish()] == ["a"]
    assert {call["index"] for call in delta.tool_calls} == {0}
    unlimited = ToolCallParser(max_calls=3)
    assert unlimited.feed(text).content == "A\n done" and not unlimited.done  # below the limit, nothing dropped


def test_arguments_written_as_a_json_string_are_unwrapped():
    text = START_TAG + json.dumps({"name": "f", "arguments": json.dumps({"q": "1"})}) + END_TAG
    _, streamed, finished = run([text])
    assert json.loads(finished[0]["function"]["arguments"]) == {"q": "1"}
    assert streamed == finished


def test_malformed_call_is_content_but_calls_after_it_still_parse():
    text = 'x<tool_call>{"name": oops}</tool_call>y<tool_call>{"name": "g", "arguments": {"k": [1]}}</tool_call>'
    content, streamed, finished = run(list(text))
    assert content == 'x<tool_call>{"name": oops}</tool_call>y'
    assert [c["function"]["name"] for c in finished] == ["g"]
    assert streamed == finished


def test_call_broken_after_its_name_streamed_is_content_and_left_out_of_finish():
    text = '<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>'
    content, streamed, finished = run(list(text))
    assert content == text
    assert finished == []
    assert [c["function"]["name"] for c in streamed] == ["f"]  # the deltas already sent remain


def test_unterminated_call_and_partial_tag_become_content_on_flush():
    for text in ['Hi <tool_call>{"name": "f", "arguments": {"a"', "Hi <tool_ca", 'Hi <tool_call>{"name": "f"}</tool_']:
        parser = ToolCallParser()
        deltas = [parser.feed(text), parser.flush()]
        assert "".join(d.content for d in deltas) == text
        assert parser.finish() == []
        assert not parser.in_tool_call


json_scalars = (
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False, allow_infinity=False)
)
json_strings = st.text(alphabet='ab "\\}{][<>/é\n\t', max_size=6)
json_values = st.recursive(
    json_scalars | json_strings,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(json_strings, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def valid_calls(draw):
    name = draw(st.text(alphabet='abc_xyzé"', min_size=1, max_size=8))
    arguments = draw(st.dictionaries(json_strings, json_values, max_size=4))
    members = [("name", name)]
    style = draw(st.sampled_from(["object", "missing", "string"]))
    if style == "object":
        members.append(("arguments", arguments))
    elif style == "string":
        members.append(("arguments", json.dumps(arguments)))
    else:
        arguments = {}
    if draw(st.booleans()):
        members.reverse()
    dumps_options = draw(
        st.fixed_dictionaries(
            {
                "indent": st.sampled_from([None, 2]),
                "ensure_ascii": st.booleans(),
                "separators": st.sampled_from([None, (",", ":")]),
            }
        )
    )
    body = json.dumps(dict(members), **dumps_options)
    pad = draw(st.sampled_from(["", "\n", " \n"]))
    return START_TAG + pad + body + pad + END_TAG, (name, arguments)


content_texts = st.lists(
    st.sampled_from(["Sure.", " ", "\n", "<", "tool", "_call", ">", "</tool_call>", "a", "{", '"', "<tool_ca"]),
    max_size=4,
).map("".join)
malformed_calls = st.sampled_from(MALFORMED_BODIES).map(lambda body: START_TAG + body + END_TAG)
segments = st.lists(
    st.one_of(
        content_texts.map(lambda text: ("content", text, None)),
        malformed_calls.map(lambda text: ("malformed", text, None)),
        valid_calls().map(lambda pair: ("call", pair[0], pair[1])),
    ),
    max_size=6,
)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(parts=segments, unterminated=st.booleans(), cuts=st.lists(st.integers(0, 10**4), max_size=12))
def test_any_chunking_gives_the_same_content_and_calls(parts, unterminated, cuts):
    tail = START_TAG + '{"name": "late", "arguments": {"a": [' if unterminated else ""
    text = "".join(part for _, part, _ in parts) + tail
    num_tagged = sum(kind != "content" for kind, _, _ in parts) + bool(unterminated)
    assume(text.count(START_TAG) == num_tagged)  # content fragments must not spell a tag

    whole = run([text])
    assert run(split(text, cuts)) == whole
    assert run(list(text)) == whole

    content, streamed, finished = whole
    assert content == "".join(part for kind, part, _ in parts if kind != "call") + tail
    expected = [call for kind, _, call in parts if kind == "call"]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in finished] == expected
    # Every finished call was streamed with the same id, name and arguments text.
    by_id = {c["id"]: c for c in streamed}
    assert all(by_id[c["id"]] == c for c in finished)
