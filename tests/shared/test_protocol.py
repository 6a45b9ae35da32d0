"""The wire format both sides rely on: jobs, job state, events and control messages round-trip."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.heartbeat import Heartbeat
from shared.protocol import (
    CancelMessage,
    DeltaEvent,
    ErrorEvent,
    FinalEvent,
    Job,
    JobState,
    Usage,
    encode_event,
    parse_control,
    parse_event,
)

texts = st.text(max_size=20)
ids = st.lists(st.integers(0, 200_000), max_size=8)


def test_job_fields_are_all_strings_and_round_trip() -> None:
    job = Job(id="chatcmpl-1", model="m", kind="chat", body='{"a": 1}', created=10.5, deadline=70.5)

    fields = job.to_fields()

    assert fields == {
        "id": "chatcmpl-1",
        "model": "m",
        "kind": "chat",
        "body": '{"a": 1}',
        "created": "10.5",
        "deadline": "70.5",
        "attempt": "1",
        "priority": "0",
        "prefixes": "",
    }
    assert Job.from_fields({k.encode(): v.encode() for k, v in fields.items()}) == job
    assert job.request() == {"a": 1}


def test_job_rejects_unknown_kind_and_extra_fields() -> None:
    fields = Job(id="x", model="m", kind="completion", body="{}", created=1, deadline=2).to_fields()
    with pytest.raises(ValidationError):
        Job.from_fields(fields | {"kind": "embedding"})
    with pytest.raises(ValidationError):
        Job.from_fields(fields | {"urgency": "9"})


def test_job_state_is_a_small_hash_and_its_tokens_are_replayed_from_the_event_log() -> None:
    log = [
        DeltaEvent(id="r", attempt=1, seq=0, choice=0, text="a", token_ids=[1, 2]),
        DeltaEvent(id="r", attempt=1, seq=1, choice=1, text="b", token_ids=[3]),
        FinalEvent(
            id="r", attempt=1, seq=2, choice=1, finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)
        ),
        DeltaEvent(id="r", attempt=2, seq=3, choice=0, text="c", token_ids=[4]),
        DeltaEvent(id="r", attempt=2, seq=4, choice=0, text="d", token_ids=[5]),  # past next_seq: not yet landed
    ]
    fields = JobState(worker="w1", attempt=2, next_seq=4).to_fields()

    assert fields == {"worker": "w1", "attempt": "2", "next_seq": "4"}
    state = JobState.from_fields(fields, [encode_event(event) for event in log])
    assert state == JobState(
        worker="w1", attempt=2, emitted_token_ids=[[1, 2, 4], [3]], finished_choices=[1], next_seq=4
    )
    assert JobState.from_fields(fields) == JobState(worker="w1", attempt=2, next_seq=4)


@given(
    seq=st.integers(0, 10_000),
    choice=st.integers(0, 7),
    text=texts,
    reasoning=texts,
    token_ids=ids,
)
def test_delta_events_round_trip(seq: int, choice: int, text: str, reasoning: str, token_ids: list[int]) -> None:
    event = DeltaEvent(id="r", attempt=1, seq=seq, choice=choice, text=text, reasoning=reasoning, token_ids=token_ids)

    assert parse_event(encode_event(event)) == event
    assert parse_event(encode_event(event).encode()) == event


def test_events_are_told_apart_by_type() -> None:
    raw = [
        '{"id": "r", "attempt": 1, "seq": 0, "type": "delta", "text": "hi"}',
        '{"id": "r", "attempt": 1, "seq": 1, "type": "final", "finish_reason": "length",'
        ' "usage": {"prompt_tokens": 3, "completion_tokens": 1}, "stats": {"drafts": 2, "custom": 5}}',
        '{"id": "r", "attempt": 2, "seq": 2, "type": "error", "message": "boom", "code": "dead_letter"}',
    ]

    delta, final, error = (parse_event(r) for r in raw)

    assert isinstance(delta, DeltaEvent) and delta.text == "hi" and delta.choice == 0
    assert isinstance(final, FinalEvent) and final.finish_reason == "length" and final.stats.drafts == 2
    assert final.stats.model_extra == {"custom": 5}  # workers may report more stats
    assert isinstance(error, ErrorEvent) and error.code == "dead_letter"


@pytest.mark.parametrize(
    "raw",
    [
        '{"id": "r", "attempt": 1, "seq": 0, "type": "smile"}',
        '{"id": "r", "attempt": 1, "type": "delta"}',
        '{"id": "r", "attempt": 1, "seq": 0, "type": "delta", "colour": "red"}',
        '{"id": "r", "attempt": 1, "seq": 0, "type": "final", "finish_reason": "bored",'
        ' "usage": {"prompt_tokens": 1, "completion_tokens": 1}}',
        "not json",
    ],
)
def test_malformed_events_are_rejected(raw: str) -> None:
    with pytest.raises(ValidationError):
        parse_event(raw)


def test_tool_call_deltas_follow_openai() -> None:
    raw = (
        '{"id": "r", "attempt": 1, "seq": 0, "type": "delta", "tool_calls": [{"index": 0, "id": "call_1",'
        ' "type": "function", "function": {"name": "f", "arguments": "{"}}]}'
    )

    [call] = parse_event(raw).tool_calls

    assert (call.index, call.id, call.function.name, call.function.arguments) == (0, "call_1", "f", "{")


def test_control_messages_round_trip() -> None:
    raw = CancelMessage(id="chatcmpl-1").model_dump_json()

    assert json.loads(raw) == {"type": "cancel", "id": "chatcmpl-1"}
    assert parse_control(raw).id == "chatcmpl-1"


def test_heartbeat_round_trips_through_a_hash() -> None:
    beat = Heartbeat(
        worker_id="w",
        model="m",
        speculation="tree",
        ready=True,
        lanes_total=8,
        lanes_busy=3,
        drafts=4,
        accepted_tokens=9,
        started_at=100.0,
        beat_at=105.0,
    )

    fields = beat.to_fields()

    assert fields["ready"] == "1" and fields["lanes_busy"] == "3" and fields["speculation"] == "tree"
    assert Heartbeat.from_fields({k.encode(): v.encode() for k, v in fields.items()}) == beat
    assert Heartbeat.from_fields(fields | {"ready": "0"}).ready is False
    assert beat.age_s(now=107.5) == 2.5


def test_a_heartbeats_aliases_round_trip_and_name_its_model() -> None:
    beat = Heartbeat(
        worker_id="w",
        model="qwen",
        aliases=("claude-sonnet-4-5", "gpt-5"),
        speculation="none",
        ready=True,
        lanes_total=1,
        lanes_busy=0,
        started_at=1.0,
        beat_at=2.0,
    )

    fields = beat.to_fields()

    assert fields["aliases"] == "claude-sonnet-4-5,gpt-5"
    assert Heartbeat.from_fields(fields) == beat
    assert Heartbeat.from_fields({k: v for k, v in fields.items() if k != "aliases"}).aliases == ()  # an older worker
    assert beat.serves("qwen") and beat.serves("gpt-5") and not beat.serves("gpt")
