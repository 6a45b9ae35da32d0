"""The assembler alone: protocol events in, output items and Responses stream events out."""

from __future__ import annotations

from typing import Any

from gateway.errors import ApiError
from gateway.responses_api.assembler import ResponseAssembler
from gateway.responses_api.objects import ResponseObject
from shared.protocol import DeltaEvent, FinalEvent, ToolCallDelta, Usage


def _delta(text: str = "", reasoning: str = "", calls: list[dict] | None = None, num_tokens: int = 1) -> DeltaEvent:
    tool_calls = [ToolCallDelta.model_validate(call) for call in calls or []]
    return DeltaEvent(id="r", attempt=1, seq=0, text=text, reasoning=reasoning, token_ids=[1] * num_tokens,
                      tool_calls=tool_calls)  # fmt: skip


def _final(reason: str = "stop", completion_tokens: int = 5) -> FinalEvent:
    usage = Usage(prompt_tokens=9, completion_tokens=completion_tokens)
    return FinalEvent(id="r", attempt=1, seq=0, finish_reason=reason, usage=usage)


def _call(index: int, name: str, arguments: str) -> list[dict]:
    return [{"index": index, "id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": ""}},
            {"index": index, "function": {"arguments": arguments}}]  # fmt: skip


def _run(*events: DeltaEvent | FinalEvent) -> tuple[ResponseObject, list[dict[str, Any]]]:
    assembler = ResponseAssembler(ResponseObject(id="resp-1", created_at=0, model="m"))
    stream = assembler.opening()
    for event in events:
        stream += assembler.add(event)
    return assembler.response, stream + assembler.terminal()


def _shape(response: ResponseObject) -> list[tuple[str, str]]:
    shape = []
    for item in response.output:
        text = item.arguments if item.type == "function_call" else "".join(part.text for part in item.content)
        shape.append((item.type, text))
    return shape


def test_whitespace_between_calls_opens_no_message_but_text_after_a_call_does() -> None:
    response, _ = _run(
        _delta("Checking."),
        _delta(calls=_call(0, "a", '{"x": 1}')),
        _delta("\n"),
        _delta(calls=_call(1, "b", "{}")),
        _delta(" Then"),
        _delta(" more."),
        _final("tool_calls"),
    )

    assert _shape(response) == [
        ("message", "Checking."),
        ("function_call", '{"x": 1}'),
        ("function_call", "{}"),
        ("message", " Then more."),
    ]
    assert [item.status for item in response.output] == ["completed"] * 4


def test_a_whitespace_only_answer_is_kept_and_trailing_whitespace_after_calls_is_not() -> None:
    blank, _ = _run(_delta("\n"), _delta(" "), _final())
    called, _ = _run(_delta(calls=_call(0, "a", "{}")), _delta("\n"), _final("tool_calls"))

    assert _shape(blank) == [("message", "\n ")]
    assert _shape(called) == [("function_call", "{}")]


def test_one_delta_with_reasoning_and_text_makes_two_items_in_that_order() -> None:
    response, stream = _run(_delta(reasoning="Think.", text="Say.", num_tokens=4), _final(completion_tokens=4))

    assert _shape(response) == [("reasoning", "Think."), ("message", "Say.")]
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens == 4
    kinds = [event["type"] for event in stream]
    assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")


def test_a_length_finish_leaves_the_open_item_and_the_response_incomplete() -> None:
    response, stream = _run(_delta("Once"), _final("length", completion_tokens=1))

    assert (response.status, response.output[0].status) == ("incomplete", "incomplete")
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert stream[-1]["type"] == "response.incomplete"
    assert [event["sequence_number"] for event in stream] == list(range(len(stream)))


def test_the_stream_carries_every_item_as_the_response_holds_it() -> None:
    response, stream = _run(
        _delta(reasoning="Hm."),
        _delta("Calling."),
        _delta(calls=_call(0, "a", '{"k": "v"}')),
        _final("tool_calls"),
    )

    done = [event["item"] for event in stream if event["type"] == "response.output_item.done"]
    assert done == [item.model_dump(mode="json") for item in response.output]
    added = [event["output_index"] for event in stream if event["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]
    assert stream[-1]["response"]["output"] == done and stream[-1]["type"] == "response.completed"


def test_a_failure_ends_the_stream_with_response_failed() -> None:
    assembler = ResponseAssembler(ResponseObject(id="resp-1", created_at=0, model="m"))
    assembler.add(_delta("Hel"))

    [event] = assembler.failed(ApiError(500, "boom", "internal_error"))

    assert event["type"] == "response.failed"
    assert event["response"]["status"] == "failed"
    assert event["response"]["error"] == {"code": "internal_error", "message": "boom"}
