"""A step's delta absorbing the next (`worker.serving.step_delta.StepDelta`): one event saying exactly
what two said, in order, at the first one's seq."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from shared.protocol import DeltaEvent, FunctionDelta, TokenLogprob, ToolCallDelta, encode_event, parse_event
from worker.serving.step_delta import StepDelta


def delta(seq: int, text: str = "", **fields) -> StepDelta:
    return StepDelta(id="r", attempt=1, seq=seq, text=text, **fields)


def call(index: int, arguments: str | None = None, name: str | None = None, id: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(
        index=index, id=id, type="function" if id else None, function=FunctionDelta(name=name, arguments=arguments)
    )


def test_an_absorbed_delta_carries_both_in_order_at_the_first_seq() -> None:
    first = delta(4, "Hel", reasoning="a", token_ids=[1, 2])
    second = delta(5, "lo", reasoning="b", token_ids=[3])

    assert first.absorb(second)

    assert first == delta(4, "Hello", reasoning="ab", token_ids=[1, 2, 3])
    assert second == delta(5, "lo", reasoning="b", token_ids=[3]), "the absorbed delta is left alone"
    assert first.event() == DeltaEvent(id="r", attempt=1, seq=4, text="Hello", reasoning="ab", token_ids=[1, 2, 3])


@given(
    st.lists(
        st.tuples(st.text(max_size=5), st.text(max_size=5), st.lists(st.integers(0, 99), max_size=3)),
        min_size=1,
        max_size=8,
    )
)
def test_absorbing_a_run_of_deltas_loses_and_repeats_nothing(parts: list[tuple[str, str, list[int]]]) -> None:
    deltas = [
        delta(i, text, reasoning=reasoning, token_ids=list(ids)) for i, (text, reasoning, ids) in enumerate(parts)
    ]

    merged = deltas[0]
    for later in deltas[1:]:
        assert merged.absorb(later)

    event = merged.event()
    assert event.seq == 0
    assert event.text == "".join(text for text, _, _ in parts)
    assert event.reasoning == "".join(reasoning for _, reasoning, _ in parts)
    assert event.token_ids == [token for _, _, ids in parts for token in ids]


def test_logprobs_stay_one_per_token() -> None:
    lp = [TokenLogprob(token="a", logprob=-0.1)]
    first = delta(0, token_ids=[1], logprobs=list(lp))
    assert first.absorb(delta(1, token_ids=[2], logprobs=list(lp))) and first.logprobs == lp * 2
    assert not first.absorb(delta(2, token_ids=[3])), "forced tokens carry no logprobs"
    assert first.token_ids == [1, 2], "a refused delta changes nothing"


def test_only_deltas_of_one_choice_and_attempt_merge() -> None:
    first = delta(0, "a")
    assert not first.absorb(delta(1, "b", choice=1))
    assert not first.absorb(StepDelta(id="r", attempt=2, seq=1, text="b"))
    assert first == delta(0, "a")


def test_tool_call_fragments_join_the_call_they_continue() -> None:
    first = delta(0, tool_calls=[call(0, '{"q', name="lookup", id="call_1")])
    second = delta(1, tool_calls=[call(0, '": 1}'), call(1, "", name="other", id="call_2"), call(1, "{}")])

    assert first.absorb(second)

    calls = first.event().tool_calls
    assert [(c.index, c.id, c.function.name, c.function.arguments) for c in calls] == [
        (0, "call_1", "lookup", '{"q": 1}'),
        (1, "call_2", "other", "{}"),
    ]
    assert json.loads(calls[0].function.arguments) == {"q": 1}


@given(
    st.text(),
    st.text(),
    st.lists(st.integers(0, 2**31 - 1), max_size=4),
    st.text(min_size=1, max_size=40),
    st.integers(0, 10**6),
    st.integers(0, 10**9),
    st.integers(0, 8),
)
def test_its_json_is_the_wire_events_byte_for_byte(
    text: str, reasoning: str, token_ids: list[int], request_id: str, attempt: int, seq: int, choice: int
) -> None:
    step = StepDelta(
        id=request_id, attempt=attempt, seq=seq, choice=choice, text=text, reasoning=reasoning, token_ids=token_ids
    )

    assert step.to_json() == encode_event(step.event())
    assert parse_event(step.to_json()) == step.event()


def test_deltas_with_tool_calls_or_logprobs_encode_as_the_wire_event() -> None:
    with_calls = delta(0, tool_calls=[call(0, '{"q', name="lookup", id="call_1")])
    with_logprobs = delta(1, "a", token_ids=[5], logprobs=[TokenLogprob(token="a", logprob=-0.25, bytes=[97])])

    for step in (with_calls, with_logprobs):
        assert step.to_json() == encode_event(step.event())
        assert parse_event(step.to_json()) == step.event()
