"""Per-choice output on scripted token streams: reasoning + budget, tool calls, stop strings, replay."""

from __future__ import annotations

import json
import random

import pytest

from tests.support.tiny_models import train_tokenizer
from worker.engine.logits_processing import TokenLogprobs
from worker.serving.lane_output import LaneDelta, LaneOutput, OutputOptions, ReasoningOptions, format_logprobs

FORCED = "\n</think>\n\n"


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def ids_of(tokenizer, text: str) -> list[int]:
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert tokenizer.decode(ids) == text
    return ids


def feed_one_by_one(output: LaneOutput, token_ids: list[int]) -> LaneDelta:
    total = LaneDelta()
    for token in token_ids:
        total.extend(output.add([token]))
    total.extend(output.finish())
    return total


def reasoning_options(tokenizer, budget=None, starts_in_reasoning=False) -> ReasoningOptions:
    return ReasoningOptions(
        starts_in_reasoning=starts_in_reasoning, budget=budget, close_ids=tuple(ids_of(tokenizer, FORCED))
    )


def test_reasoning_between_think_tags_is_split_from_the_content(tokenizer):
    output = LaneOutput(tokenizer, OutputOptions(reasoning=reasoning_options(tokenizer)), [])
    delta = feed_one_by_one(output, ids_of(tokenizer, "<think>Two apples.</think>The answer is 2."))
    assert (delta.reasoning, delta.text) == ("Two apples.", "The answer is 2.")
    assert output.num_reasoning_tokens > 0


def test_spent_reasoning_budget_forces_the_close_tag_and_the_answer_follows(tokenizer):
    options = OutputOptions(reasoning=reasoning_options(tokenizer, budget=3, starts_in_reasoning=True))
    output = LaneOutput(tokenizer, options, [])
    thinking = ids_of(tokenizer, "apples, pears, plums; questions")
    reasoning = ""
    for count, token in enumerate(thinking, start=1):  # noqa: B007 (read after the loop)
        reasoning += output.add([token]).reasoning
        forced = output.tokens_to_force()
        if forced:
            break
    assert count == 3, "the close tag is due exactly when the third reasoning token is in"
    assert forced == ids_of(tokenizer, FORCED)
    assert output.tokens_to_force() == []  # once only
    after = output.add(forced)
    after.extend(output.add(ids_of(tokenizer, "Four fruit.")))
    after.extend(output.finish())
    reasoning += after.reasoning
    assert reasoning == tokenizer.decode(thinking[:3])
    assert after.text == "\n\nFour fruit."  # the forced tag itself never shows


def test_a_zero_budget_forces_the_close_tag_before_any_token(tokenizer):
    options = OutputOptions(reasoning=reasoning_options(tokenizer, budget=0, starts_in_reasoning=True))
    output = LaneOutput(tokenizer, options, [])
    assert output.tokens_to_force() == ids_of(tokenizer, FORCED)


def test_no_budget_never_forces(tokenizer):
    output = LaneOutput(tokenizer, OutputOptions(reasoning=reasoning_options(tokenizer, starts_in_reasoning=True)), [])
    output.add(ids_of(tokenizer, "a long line of thought " * 5))
    assert output.tokens_to_force() == []


def test_a_tool_call_split_over_many_small_deltas_becomes_openai_tool_call_deltas(tokenizer):
    text = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
    token_ids = ids_of(tokenizer, text)
    assert len(token_ids) > 30  # many small pieces
    output = LaneOutput(tokenizer, OutputOptions(parse_tool_calls=True), [])
    delta = feed_one_by_one(output, token_ids)
    assert delta.text == "Sure."
    first, *rest = delta.tool_calls
    assert first["index"] == 0 and first["type"] == "function" and first["id"].startswith("call_")
    assert first["function"]["name"] == "get_weather"
    assert len(rest) > 1, "arguments stream in several fragments"
    arguments = "".join(call["function"]["arguments"] for call in delta.tool_calls)
    assert json.loads(arguments) == {"city": "Paris", "days": [1, 2]}
    assert output.made_tool_calls


@pytest.mark.parametrize("in_one_step", [False, True])
def test_a_single_call_lane_stops_when_its_first_call_closes(tokenizer, in_one_step):
    text = (
        'Both.<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>\n'
        '<tool_call>{"name": "g", "arguments": {}}</tool_call> and more'
    )
    output = LaneOutput(tokenizer, OutputOptions(parse_tool_calls=True, single_tool_call=True), [])
    token_ids = ids_of(tokenizer, text)
    if in_one_step:  # speculation or held tokens: the step runs past the call
        delta = output.add(token_ids)
        delta.extend(output.finish())
    else:
        delta = LaneDelta()
        for token in token_ids:
            delta.extend(output.add([token]))
            if output.stopped:
                break
        delta.extend(output.finish())
    assert output.stopped and output.made_tool_calls
    assert delta.text == "Both." and {call["index"] for call in delta.tool_calls} == {0}
    assert [call["function"].get("name") for call in delta.tool_calls][0] == "f"
    unlimited = LaneOutput(tokenizer, OutputOptions(parse_tool_calls=True), [])
    assert {call["index"] for call in feed_one_by_one(unlimited, token_ids).tool_calls} == {0, 1}
    assert not unlimited.stopped


@pytest.mark.parametrize("in_one_step", [False, True])
def test_a_forced_lane_stops_at_a_repeated_call_and_sends_no_content(tokenizer, in_one_step):
    call = '<tool_call>\n{"name":"f","arguments":{"a":1}}\n</tool_call>'
    other = '<tool_call>\n{"name":"f","arguments":{"a":12}}\n</tool_call>'
    token_ids = ids_of(tokenizer, "\n".join([call, other, call, other]))
    output = LaneOutput(tokenizer, OutputOptions(parse_tool_calls=True, forced_tool_calls=True), [])
    delta = output.add(token_ids) if in_one_step else LaneDelta()
    for token in [] if in_one_step else token_ids:
        delta.extend(output.add([token]))
    assert output.stopped and output.made_tool_calls
    delta.extend(output.finish())
    arguments = ["".join(d["function"]["arguments"] for d in delta.tool_calls if d["index"] == i) for i in (0, 1)]
    assert arguments == ['{"a":1}', '{"a":12}'] and {d["index"] for d in delta.tool_calls} == {0, 1}
    assert delta.text == ""


def test_echo_goes_out_once_before_the_first_output_and_is_dropped_with_a_replay(tokenizer):
    token_ids = ids_of(tokenizer, " jumps over the dog")
    output = LaneOutput(tokenizer, OutputOptions(echo="The fox"), [])
    assert output.add([]).text == ""  # a resumed lane with nothing emitted yet: echo still to come
    assert feed_one_by_one(output, token_ids).text == "The fox jumps over the dog"
    replayed = LaneOutput(tokenizer, OutputOptions(echo="The fox"), [])
    replayed.add(token_ids[:2])  # what a dead worker published, echo included: dropped
    rest = tokenizer.decode(token_ids)[len(tokenizer.decode(token_ids[:2])) :]
    assert feed_one_by_one(replayed, token_ids[2:]).text == rest


def test_reasoning_then_a_tool_call(tokenizer):
    options = OutputOptions(reasoning=reasoning_options(tokenizer), parse_tool_calls=True)
    output = LaneOutput(tokenizer, options, [])
    text = '<think>Need weather.</think><tool_call>{"name": "f", "arguments": {}}</tool_call>'
    delta = feed_one_by_one(output, ids_of(tokenizer, text))
    assert delta.reasoning == "Need weather." and delta.text == ""
    assert [call["function"].get("name") for call in delta.tool_calls][0] == "f"


def test_a_malformed_tool_call_comes_back_as_content(tokenizer):
    output = LaneOutput(tokenizer, OutputOptions(parse_tool_calls=True), [])
    text = "<tool_call>{not json}</tool_call>"
    delta = feed_one_by_one(output, ids_of(tokenizer, text))
    assert delta.text == text and delta.tool_calls == [] and not output.made_tool_calls


def test_stop_string_across_token_boundaries_ends_the_text(tokenizer):
    output = LaneOutput(tokenizer, OutputOptions(stop=("lazy dog",)), [])
    token_ids = ids_of(tokenizer, "The quick brown fox jumps over the lazy dog. Hello")
    text = ""
    for token in token_ids:
        text += output.add([token]).text
        if output.stopped:
            break
    assert output.stopped and text == "The quick brown fox jumps over the "


@pytest.mark.parametrize("tools", [False, True])
def test_replaying_published_tokens_continues_the_stream_without_a_seam(tokenizer, tools):
    """What a reclaiming worker does: a fresh output fed the emitted tokens (output dropped), then the rest."""
    options = OutputOptions(reasoning=reasoning_options(tokenizer), parse_tool_calls=tools)
    text = '<think>Hmm, é?</think>Yes: <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> done'
    token_ids = ids_of(tokenizer, text)
    whole = feed_one_by_one(LaneOutput(tokenizer, options, []), token_ids)
    for cut in range(len(token_ids) + 1):
        first = LaneOutput(tokenizer, options, [])
        published = LaneDelta()
        for token in token_ids[:cut]:
            published.extend(first.add([token]))
        second = LaneOutput(tokenizer, options, [])
        second.add(token_ids[:cut])  # replayed, not sent
        rest = feed_one_by_one(second, token_ids[cut:])
        assert published.text + rest.text == whole.text, cut
        assert published.reasoning + rest.reasoning == whole.reasoning, cut
        fragments = [c["function"].get("arguments", "") for c in published.tool_calls + rest.tool_calls]
        assert "".join(fragments) == "".join(c["function"].get("arguments", "") for c in whole.tool_calls), cut


def test_logprobs_are_formatted_with_token_text_and_bytes(tokenizer):
    hello = ids_of(tokenizer, "Hello")[0]
    entries = [TokenLogprobs(hello, -0.5, [(hello, -0.5), (hello + 1, -1.5)])]
    [formatted] = format_logprobs(tokenizer, entries)
    assert formatted.token == tokenizer.decode([hello]) and formatted.logprob == -0.5
    assert formatted.bytes == list(formatted.token.encode())
    assert [top.logprob for top in formatted.top_logprobs] == [-0.5, -1.5]


@pytest.mark.parametrize(
    "options",
    [
        OutputOptions(),
        OutputOptions(parse_tool_calls=True),
        OutputOptions(stop=("lazy dog",), parse_tool_calls=True),
        OutputOptions(reasoning=ReasoningOptions(budget=3, close_ids=(1,))),
    ],
)
@pytest.mark.parametrize("step", [2, 3, 5])
def test_a_multi_token_step_says_what_its_tokens_say_one_by_one(tokenizer, options, step):
    """A speculative step emits several tokens at once; without a reasoning parser to count them
    they go through the text pipeline together."""
    text = (
        'Fox é <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> '
        "<think>a b c d e</think> over the lazy dog. Hello"
    )
    token_ids = ids_of(tokenizer, text)
    one_by_one = LaneOutput(tokenizer, options, [])
    expected = LaneDelta()
    for token in token_ids:
        if one_by_one.stopped:
            break
        expected.extend(one_by_one.add([token]))
    expected.extend(one_by_one.finish())

    in_steps = LaneOutput(tokenizer, options, [])
    got = LaneDelta()
    for start in range(0, len(token_ids), step):
        if in_steps.stopped:
            break
        got.extend(in_steps.add(token_ids[start : start + step]))
    got.extend(in_steps.finish())

    assert (got.text, got.reasoning) == (expected.text, expected.reasoning)
    assert calls_of(got) == calls_of(expected), "fragments may split differently, the calls may not"
    assert in_steps.stopped == one_by_one.stopped
    assert in_steps.made_tool_calls == one_by_one.made_tool_calls


@pytest.mark.parametrize(
    "options",
    [
        OutputOptions(),
        OutputOptions(parse_tool_calls=True),
        OutputOptions(reasoning=ReasoningOptions(budget=3, close_ids=(1,))),
    ],
)
def test_replay_is_seamless_whatever_the_tokens(tokenizer, options):
    """Random ids (a tiny model's output) end inside characters all the time: the replayed
    tokens must leave the detokenizer holding back exactly what the dead worker's held back."""
    rng = random.Random(1)
    for _ in range(60):
        prompt = [rng.randrange(tokenizer.get_vocab_size()) for _ in range(6)]
        token_ids = [rng.randrange(tokenizer.get_vocab_size()) for _ in range(24)]
        whole = feed_one_by_one(LaneOutput(tokenizer, options, prompt), token_ids)
        cut = rng.randrange(len(token_ids) + 1)
        first = LaneOutput(tokenizer, options, prompt)
        published = LaneDelta()
        for token in token_ids[:cut]:
            published.extend(first.add([token]))
        second = LaneOutput(tokenizer, options, prompt)
        second.add(token_ids[:cut])  # replayed, not sent
        rest = feed_one_by_one(second, token_ids[cut:])
        assert (published.text + rest.text, published.reasoning + rest.reasoning) == (whole.text, whole.reasoning)


def calls_of(delta: LaneDelta) -> dict[int, list[str]]:
    """Tool-call deltas joined as a client joins them: per index, its name and arguments (ids are random)."""
    calls: dict[int, list[str]] = {}
    for call in delta.tool_calls:
        joined = calls.setdefault(call["index"], ["", ""])
        joined[0] += call["function"].get("name") or ""
        joined[1] += call["function"].get("arguments") or ""
    return calls
