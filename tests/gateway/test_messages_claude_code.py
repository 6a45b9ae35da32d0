"""/v1/messages as Claude Code speaks it now, against a scripted peer: `system` entries among the
turns, thinking `adaptive` with `display`, `output_config`, `context_management`, tools with
`cache_control`; message_start reporting the prompt's size; count_tokens taking the same body."""

from __future__ import annotations

from typing import Any

import anthropic

from shared.openai_schema import ChatCompletionRequest
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import Step, delta, final
from tests.gateway.test_messages_api import WEATHER_TOOL, _sse

PROMPT_TOKENS = 41
IGNORED = "arbor_ignored_request_fields_total{"
CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 32000,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {"role": "system", "content": "The user switched to plan mode."},
        {"role": "assistant", "content": [{"type": "text", "text": "Sure."}]},
        {"role": "system", "content": [{"type": "text", "text": "Today is 2026-12-04."}]},
        {"role": "user", "content": "Go on."},
    ],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "output_config": {"effort": "high"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "tools": [WEATHER_TOOL | {"cache_control": {"type": "ephemeral"}}],
    "metadata": {"user_id": "user_abc_account_def_session_ghi"},
}


def _with_prompt_size(job: Job) -> list[Step]:
    """The worker's way: the first delta says how long the prompt is, the final one the usage."""
    end = final("stop", prompt_tokens=PROMPT_TOKENS, completion_tokens=2)
    end.event["usage"]["cached_tokens"] = 32
    return [delta("Hel", token_ids=[1], prompt_tokens=PROMPT_TOKENS), delta("lo", token_ids=[2]), end]


def test_system_entries_join_the_system_prompt_in_order(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_with_prompt_size)

    response = gateway.http().post("/v1/messages", json=CLAUDE_CODE_BODY)

    assert response.status_code == 200, response.text
    chat = ChatCompletionRequest.model_validate_json(peer.jobs[0].body)
    assert [message.role for message in chat.messages] == ["system", "user", "assistant", "user"]
    assert chat.messages[0].content == (
        "You are Claude Code.\n\nThe user switched to plan mode.\n\nToday is 2026-12-04."
    )
    assert chat.reasoning_budget is None and chat.chat_template_kwargs is None  # adaptive: the model's default
    assert chat.max_tokens == 8192  # lowered to ARBOR_MAX_TOKENS_CAP; the worker lowers it to what fits
    ignored = [line for line in gateway.http().get("/metrics").text.splitlines() if line.startswith(IGNORED)]
    assert ignored == [], "every field Claude Code sends is a known one"


def test_message_start_reports_the_prompts_size_and_message_delta_the_cache(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_with_prompt_size)

    events = _sse(gateway, CLAUDE_CODE_BODY)

    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == PROMPT_TOKENS
    assert events[-2][1]["usage"] == {
        "input_tokens": PROMPT_TOKENS - 32,
        "output_tokens": 2,
        "cache_read_input_tokens": 32,
        "cache_creation_input_tokens": 0,
    }


def test_the_sdk_reads_the_stream_of_a_claude_code_body(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_with_prompt_size)
    client = anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0)
    body = dict(CLAUDE_CODE_BODY)
    extra = {key: body.pop(key) for key in ("output_config", "context_management", "thinking")}

    with client.messages.stream(**body, extra_body=extra) as stream:
        started = next(iter(stream))
        message = stream.get_final_message()

    assert started.type == "message_start" and started.message.usage.input_tokens == PROMPT_TOKENS
    assert message.content[0].type == "text" and message.content[0].text == "Hello"
    assert message.stop_reason == "end_turn"


def test_count_tokens_takes_the_same_body(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=lambda job: [final("stop", prompt_tokens=PROMPT_TOKENS, completion_tokens=0)])
    body = {key: value for key, value in CLAUDE_CODE_BODY.items() if key not in ("max_tokens", "metadata")}

    response = gateway.http().post("/v1/messages/count_tokens", json=body)

    assert response.status_code == 200, response.text
    assert response.json() == {"input_tokens": PROMPT_TOKENS}
    chat = ChatCompletionRequest.model_validate_json(peer.jobs[0].body)
    assert [message.role for message in chat.messages] == ["system", "user", "assistant", "user"]


def test_output_config_format_constrains_the_answer_as_response_format(gateway: GatewayServer, peer) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    body = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "n?"}]}

    response = gateway.http().post(
        "/v1/messages", json=body | {"output_config": {"format": {"type": "json_schema", "schema": schema}}}
    )

    assert response.status_code == 200, response.text
    chat = ChatCompletionRequest.model_validate_json(peer.jobs[0].body)
    assert chat.response_format is not None and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.schema_ == schema
