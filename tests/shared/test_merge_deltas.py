"""Merging deltas (`shared.protocol.merge_deltas`): one event saying exactly what two said, in order."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from shared.protocol import (
    DeltaEvent,
    FinalEvent,
    FunctionDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    merge_deltas,
)


def delta(seq: int, text: str = "", **fields) -> DeltaEvent:
    return DeltaEvent(id="r", attempt=1, seq=seq, text=text, **fields)


def call(index: int, arguments: str | None = None, name: str | None = None, id: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(index=index, id=id, type="function" if id else None,
                         function=FunctionDelta(name=name, arguments=arguments))


def test_a_merged_delta_carries_both_in_order_at_the_first_seq() -> None:
    first = delta(4, "Hel", reasoning="a", token_ids=[1, 2])
    second = delta(5, "lo", reasoning="b", token_ids=[3])

    merged = merge_deltas(first, second)

    assert merged == delta(4, "Hello", reasoning="ab", token_ids=[1, 2, 3])
    assert first == delta(4, "Hel", reasoning="a", token_ids=[1, 2]), "the inputs are left alone"


@given(st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5), st.lists(st.integers(0, 99), max_size=3)),
                min_size=1, max_size=8))
def test_merging_a_run_of_deltas_loses_and_repeats_nothing(parts: list[tuple[str, str, list[int]]]) -> None:
    events = [delta(i, text, reasoning=reasoning, token_ids=ids) for i, (text, reasoning, ids) in enumerate(parts)]

    merged = events[0]
    for event in events[1:]:
        merged = merge_deltas(merged, event)

    assert merged.seq == 0
    assert merged.text == "".join(text for text, _, _ in parts)
    assert merged.reasoning == "".join(reasoning for _, reasoning, _ in parts)
    assert merged.token_ids == [token for _, _, ids in parts for token in ids]


def test_logprobs_stay_one_per_token() -> None:
    lp = [TokenLogprob(token="a", logprob=-0.1)]
    assert merge_deltas(delta(0, token_ids=[1], logprobs=lp), delta(1, token_ids=[2], logprobs=lp)).logprobs == lp * 2
    assert merge_deltas(delta(0, token_ids=[1], logprobs=lp), delta(1, token_ids=[2])) is None  # forced tokens


def test_only_deltas_of_one_choice_and_attempt_merge() -> None:
    final = FinalEvent(id="r", attempt=1, seq=1, finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))
    assert merge_deltas(delta(0, "a"), final) is None
    assert merge_deltas(final, delta(1, "a")) is None
    assert merge_deltas(delta(0, "a"), delta(1, "b", choice=1)) is None
    assert merge_deltas(delta(0, "a"), DeltaEvent(id="r", attempt=2, seq=1, text="b")) is None
    assert merge_deltas(delta(0, "a"), None) is None


def test_tool_call_fragments_join_the_call_they_continue() -> None:
    first = delta(0, tool_calls=[call(0, '{"q', name="lookup", id="call_1")])
    second = delta(1, tool_calls=[call(0, '": 1}'), call(1, "", name="other", id="call_2"), call(1, "{}")])

    calls = merge_deltas(first, second).tool_calls

    assert [(c.index, c.id, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_1", "lookup", '{"q": 1}'),
        (1, "call_2", "other", "{}"),
    ]
    assert json.loads(calls[0].function.arguments) == {"q": 1}
