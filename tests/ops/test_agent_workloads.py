"""`arbor bench agent`'s workloads: deterministic from the seed, and every request they lead to is a
chat request the gateway accepts (its own request model, constraints compiled), whatever the
model answers within the schemas."""

from __future__ import annotations

import json
import random
import sysconfig
from pathlib import Path

import jsonschema
import pytest

from ops.bench.agent_client import TurnResult, history_after, turn_body
from ops.bench.agent_workloads import (
    ORDER_SCHEMA,
    WORKLOADS,
    Conversation,
    WorkloadSizes,
    conversations,
    stdlib_excerpt,
)
from shared.openai_schema import ChatCompletionRequest

SIZES = WorkloadSizes(file_chars=600)


def test_the_same_seed_gives_the_same_conversations_and_another_seed_others():
    first = conversations(list(WORKLOADS), 9, seed=7, sizes=SIZES)
    again = conversations(list(WORKLOADS), 9, seed=7, sizes=SIZES)
    other = conversations(list(WORKLOADS), 9, seed=8, sizes=SIZES)
    assert first == again
    assert [c.turns[0].user for c in first] != [c.turns[0].user for c in other]
    assert [c.workload for c in first] == ["tools", "extract", "code"] * 3
    assert conversations(list(WORKLOADS), 3, seed=7, sizes=SIZES) == first[:3], "conversation i: the same at any count"


def test_tool_results_are_a_function_of_the_call():
    (travel,) = conversations(["tools"], 1, seed=0, sizes=SIZES)
    arguments = '{"city":"Oslo","days":3}'
    result = json.loads(travel.tool_result("get_weather", arguments))
    assert result["city"] == "Oslo" and len(result["forecast"]) == 3
    assert travel.tool_result("get_weather", arguments) == travel.tool_result("get_weather", arguments)
    assert json.loads(travel.tool_result("get_weather", "not json"))["city"] == "Lisbon", "the first allowed value"


def test_code_files_are_standard_library_excerpts_and_edits_stay_in_the_replayed_copy():
    (code,) = [c for c in conversations(list(WORKLOADS), 3, seed=1, sizes=SIZES) if c.workload == "code"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path, text in code.files.items():
        assert 0 < len(text) <= SIZES.file_chars
        assert text in (stdlib / path.removeprefix("lib/")).read_text(encoding="utf-8")
        assert text.lstrip().startswith(("def ", "class ")), text[:80]
    path = next(iter(code.files))
    old = code.files[path][:12]
    replay = code.fresh()
    edited = replay.tool_result("replace_in_file", json.dumps({"path": path, "old": old, "new": "EDITED"}))
    assert edited.startswith(f"Replaced 1 occurrence in {path}") and "EDITED" in edited
    assert replay.tool_result("read_file", json.dumps({"path": path})).startswith("EDITED")
    assert code.files[path].startswith(old), "the conversation itself is unchanged: every replay starts alike"
    missing = replay.tool_result("replace_in_file", json.dumps({"path": path, "old": "no such text", "new": "x"}))
    assert missing.startswith("No match")


def test_an_excerpt_is_whole_lines_within_the_limit():
    text = stdlib_excerpt("textwrap.py", random.Random(0), 300)
    assert text.endswith("\n") and len(text) <= 300


@pytest.mark.parametrize("workload", WORKLOADS)
def test_every_turn_is_a_valid_chat_request_with_the_model_answering_within_the_schemas(workload: str):
    """Each turn's body, with the history a model's answers would build (made here from the
    schemas: the first allowed value of each field), validates as the gateway validates it."""
    (conversation,) = [c for c in conversations(list(WORKLOADS), 3, seed=3, sizes=SIZES) if c.workload == workload]
    replay = conversation.fresh()
    messages = replay.first_messages()
    for index, turn in enumerate(replay.turns):
        if turn.user is not None:
            messages.append({"role": "user", "content": turn.user})
        body = turn_body("m", replay, turn, messages, 0.0)
        request = ChatCompletionRequest.model_validate(body)  # constraints compile (llguidance)
        assert request.include_speculation_stats and request.include_usage
        messages += history_after(replay, _answer(replay, turn.tool_choice, turn.response_format, index))
    roles = [message["role"] for message in messages]
    assert roles[0] == "system" and roles.count("assistant") == len(replay.turns)
    for message, following in zip(messages, messages[1:], strict=False):
        for call in message.get("tool_calls", []):
            assert following["role"] == "tool" and following["tool_call_id"] == call["id"]


def _answer(conversation: Conversation, tool_choice, response_format, index: int) -> TurnResult:
    """What a model could answer: a call with schema-valid arguments, a JSON record, or text."""
    result = TurnResult(conversation.workload, index, isinstance(tool_choice, dict), response_format is not None)
    if isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        (tool,) = [t for t in conversation.tools if t["function"]["name"] == name]
        arguments = _example(tool["function"]["parameters"])
        jsonschema.validate(arguments, tool["function"]["parameters"])
        result.calls[0] = {"id": f"call_{index}", "name": name, "arguments": json.dumps(arguments)}
    elif response_format is not None:
        record = _example(ORDER_SCHEMA)
        jsonschema.validate(record, response_format["json_schema"]["schema"])
        result.content.append(json.dumps(record))
    else:
        result.content.append("Done.")
    return result


def _example(schema: dict):
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema["type"]
    if kind == "object":
        return {name: _example(sub) for name, sub in schema["properties"].items()}
    if kind == "array":
        return [_example(schema["items"])] * schema.get("minItems", 1)
    if kind == "integer":
        return schema.get("minimum", 1)
    if kind == "boolean":
        return True
    return "2027-01-10" if "pattern" in schema else "x"


def test_tool_results_go_back_as_tool_messages_and_json_answers_as_content():
    (travel,) = conversations(["tools"], 1, seed=0, sizes=SIZES)
    answer = _answer(travel, travel.turns[0].tool_choice, None, 0)
    assistant, tool = history_after(travel, answer)
    assert assistant == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Lisbon", "days": 1}'},
            }
        ],
    }
    assert tool["role"] == "tool" and json.loads(tool["content"])["city"] == "Lisbon"
