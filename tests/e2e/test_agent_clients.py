"""Agent CLIs' requests against a real worker serving a tiny random Qwen3 with a 256-token context,
behind the real gateway, through the real openai and anthropic SDKs: a max_tokens of 32000 is
served and ends at the context's end (`length`, `max_tokens`, `incomplete`), a prompt longer than
the context is a 400 naming it, a body shaped as Claude Code sends it streams with message_start
reporting the prompt's size as count_tokens counts it, and a body shaped as Codex sends it is
answered."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from shared.settings import GatewaySettings
from tests.gateway.conftest import GatewayServer
from tests.support.redis_server import RedisServer
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_for
from tests.worker.service.harness import InProcessWorker, service_config
from worker.serving_model import load_serving_model

MODEL = "tiny-agent-model"
CONTEXT = 256
AGENT_MAX_TOKENS = 32000  # what Claude Code, OpenCode and Qwen Code ask for whatever the model
USER = {"role": "user", "content": "Write a long story."}
RUN_ON = {"ignore_eos": True}  # Arbor's: a random model must not stop early at EOS


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    folder = make_tiny_model(tmp_path_factory.mktemp("agent") / MODEL, max_position_embeddings=CONTEXT)
    served = load_serving_model(folder, "none", max_context=CONTEXT)
    with (
        RedisServer() as redis_server,
        InProcessWorker(service_config(redis_server.url, model_name=MODEL, max_context=CONTEXT), served),
    ):
        server = GatewayServer(GatewaySettings(redis_url=redis_server.url, request_timeout_s=120.0)).start()
        health = server.http()
        wait_for(lambda: health.get("/health").status_code == 200, 60, "the gateway to see the worker")
        yield server
        server.stop()


def _openai(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _anthropic(gateway: GatewayServer) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=120)


def test_chat_max_tokens_32000_runs_to_the_contexts_end(gateway: GatewayServer) -> None:
    reply = _openai(gateway).chat.completions.create(
        model=MODEL, messages=[USER], max_tokens=AGENT_MAX_TOKENS, extra_body=RUN_ON
    )

    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.prompt_tokens + reply.usage.completion_tokens == CONTEXT


def test_completions_max_tokens_32000_runs_to_the_contexts_end(gateway: GatewayServer) -> None:
    reply = _openai(gateway).completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=AGENT_MAX_TOKENS, extra_body=RUN_ON
    )

    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.total_tokens == CONTEXT


def test_messages_max_tokens_32000_ends_with_stop_reason_max_tokens(gateway: GatewayServer) -> None:
    message = _anthropic(gateway).messages.create(
        model=MODEL, max_tokens=AGENT_MAX_TOKENS, messages=[USER], extra_body=RUN_ON
    )

    usage = message.usage
    assert message.stop_reason == "max_tokens"
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) + usage.output_tokens == CONTEXT


def test_responses_max_output_tokens_32000_ends_incomplete(gateway: GatewayServer) -> None:
    response = _openai(gateway).responses.create(
        model=MODEL, input="Write a long story.", max_output_tokens=AGENT_MAX_TOKENS, extra_body=RUN_ON
    )

    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and response.usage.total_tokens == CONTEXT


def test_a_prompt_longer_than_the_context_is_a_400_naming_it(gateway: GatewayServer) -> None:
    long = {"role": "user", "content": "apples pears plums " * CONTEXT}

    with pytest.raises(openai.BadRequestError) as chat:
        _openai(gateway).chat.completions.create(model=MODEL, messages=[long], max_tokens=AGENT_MAX_TOKENS)
    with pytest.raises(anthropic.BadRequestError) as messages:
        _anthropic(gateway).messages.create(model=MODEL, max_tokens=AGENT_MAX_TOKENS, messages=[long])  # type: ignore[list-item]

    assert chat.value.code == "context_length_exceeded"
    assert "the prompt is" in chat.value.message and f"{CONTEXT} tokens" in chat.value.message
    assert "the prompt is" in messages.value.message


CLAUDE_CODE_BODY: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": AGENT_MAX_TOKENS,
    "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
        {"role": "system", "content": "Plan mode is on."},
        {"role": "user", "content": [{"type": "text", "text": "Go.", "cache_control": {"type": "ephemeral"}}]},
    ],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "output_config": {"effort": "medium"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "tools": [
        {
            "name": "Bash",
            "description": "Run a command",
            "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        }
    ],
    "metadata": {"user_id": "user_1_account_2_session_3"},
    "temperature": 1,
    "ignore_eos": True,
}


NOT_COUNTED = ("max_tokens", "stream", "metadata", "temperature", "ignore_eos")  # count_tokens' body has none


def test_a_claude_code_body_streams_with_message_start_counting_the_prompt(gateway: GatewayServer) -> None:
    http = httpx.Client(base_url=gateway.base_url, timeout=120)
    counted = http.post(
        "/v1/messages/count_tokens",
        json={key: value for key, value in CLAUDE_CODE_BODY.items() if key not in NOT_COUNTED},
    )
    assert counted.status_code == 200, counted.text

    with http.stream("POST", "/v1/messages", json=CLAUDE_CODE_BODY) as response:
        assert response.status_code == 200
        frames = [frame for frame in response.read().decode().split("\n\n") if frame]
    http.close()

    names = [frame.split("\n", 1)[0].removeprefix("event: ") for frame in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
    assert f'"input_tokens":{counted.json()["input_tokens"]},' in frames[0]
    assert '"stop_reason":"max_tokens"' in frames[-2]


def test_message_start_reports_the_prefill_caches_share_as_message_delta_does(gateway: GatewayServer) -> None:
    """The same body again: whatever the cache served, the start and the end agree on it."""
    client = _anthropic(gateway)
    body = {key: value for key, value in CLAUDE_CODE_BODY.items() if key in ("model", "system", "messages", "tools")}
    body |= {"max_tokens": 8, "extra_body": {"ignore_eos": True}}
    client.messages.create(**body)

    with client.messages.stream(**body) as stream:
        started = next(iter(stream))
        final = stream.get_final_message()

    assert started.type == "message_start"
    start, end = started.message.usage, final.usage
    assert (start.input_tokens, start.cache_read_input_tokens) == (end.input_tokens, end.cache_read_input_tokens)


CODEX_BODY: dict[str, Any] = {
    "model": MODEL,
    "instructions": "You are Codex.",
    "input": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be brief."}],
        },
        {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "List files."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA-opaque"},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "shell", "arguments": '{"cmd":"ls"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "README.md"},
    ],
    "tools": [
        {
            "type": "function",
            "name": "shell",
            "description": "Run a command",
            "strict": False,
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
        {"type": "local_shell"},
        {"type": "web_search", "external_web_access": False},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark", "definition": "x"}},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low", "summary": "auto"},
    "store": False,
    "stream": True,
    "stream_options": {"include_obfuscation": False},
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "session-1",
    "client_metadata": {"x-codex-window-id": "w:0"},
    "text": {"verbosity": "low"},
    "service_tier": "auto",
    "max_output_tokens": 16,
}


def test_a_codex_body_is_answered(gateway: GatewayServer) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=120) as http:
        with http.stream("POST", "/v1/responses", json=CODEX_BODY) as response:
            assert response.status_code == 200
            frames = [frame for frame in response.read().decode().split("\n\n") if frame]
        metrics = http.get("/metrics").text

    names = [frame.split("\n", 1)[0].removeprefix("event: ") for frame in frames]
    assert names[0] == "response.created" and names[-1] in ("response.completed", "response.incomplete")
    assert "tool type 'local_shell' is not supported by Arbor; skipped" in frames[-1]
    ignored = [line for line in metrics.splitlines() if line.startswith("arbor_ignored_request_fields_total{")]
    assert [line for line in ignored if 'route="/v1/responses"' in line] == []  # Codex sends only known fields
