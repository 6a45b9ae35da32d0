"""The live stack through the official `anthropic` SDK: messages, streams, tools, thinking, counting,
cached tokens, aliases, and a request in the shape Claude Code sends.

Exact texts and calls come from the scripted model; a forced call from the random tiny Qwen3 (the
grammar makes it valid). A third worker, started for this module, serves a tiny model whose chat
template opens a think block, under aliases a client with fixed model names would use.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest

from tests.e2e.live_stack import SCRIPTED_MODEL, TINY_CONTEXT, TINY_MODEL, Stack, spawn, stop
from tests.support.scripted_model import PLAIN, STEPS
from tests.support.tiny_models import make_tiny_model

THINKER = "tiny-thinker"
ALIASES = ("claude-sonnet-4-5-20250929", "claude-haiku-4-5")
THINKING_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% if enable_thinking is not defined or enable_thinking %}{{ '<think>\\n' }}{% endif %}{% endif %}"
)
READY_TIMEOUT_S = 240.0
USER = {"role": "user", "content": "What is the weather in Paris?"}
CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city", "input_schema": CITY},
    {"name": "get_time", "description": "Local time in a city", "input_schema": CITY},
]
ENUM_CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Paris", "Oslo"]}},
    "required": ["city"],
    "additionalProperties": False,
}
ENUM_TOOLS = [{"name": name, "input_schema": ENUM_CITY} for name in ("get_weather", "get_time")]
LONG_SYSTEM = "You are a terse assistant. Answer in one short sentence, and never apologise. " * 3


@pytest.fixture(scope="module")
def thinker(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A worker for a model that thinks, named THINKER and, to clients, any of ALIASES."""
    folder = make_tiny_model(tmp_path_factory.mktemp("thinker") / THINKER, max_position_embeddings=TINY_CONTEXT)
    config_path = folder / "tokenizer_config.json"
    config_path.write_text(json.dumps(json.loads(config_path.read_text()) | {"chat_template": THINKING_TEMPLATE}))
    env = dict(os.environ, REDIS_URL=stack.redis_url, OMP_NUM_THREADS="1", ARBOR_LOG_LEVEL="warning")
    env |= {"ARBOR_HEARTBEAT_INTERVAL_S": "0.5"}
    names = ",".join((THINKER, *ALIASES))
    argv = ["worker", "--model", str(folder), "--speculation", "none", "--served-model-name", names]
    process = spawn(argv, env, stack.log_dir / "thinker.log")
    try:
        _wait_ready(stack, process)
        yield folder
    finally:
        assert stop({"thinker": process}) == {"thinker": 0}, stack.logs()


def _wait_ready(stack: Stack, process) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    with httpx.Client(base_url=stack.base_url, timeout=5) as http:
        while time.monotonic() < deadline:
            assert process.poll() is None, stack.logs()
            workers = http.get("/health").json().get("workers", [])
            if any(worker["model"] == THINKER and worker["ready"] for worker in workers):
                return
            time.sleep(0.5)
    raise AssertionError(f"the thinking worker was not ready within {READY_TIMEOUT_S} s\n{stack.logs()}")


@pytest.fixture(scope="module")
def client(stack: Stack) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0, timeout=60) as sdk:
        yield sdk


def test_create_returns_the_scripted_answer(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER])

    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == SCRIPTED_MODEL
    assert [(block.type, block.text) for block in message.content] == [("text", PLAIN.text)]
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert message.usage.output_tokens == len(PLAIN.pieces) + 1  # the pieces and the eos
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0


def test_a_stream_yields_the_same_message(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER])
    with client.messages.stream(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER]) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()

    assert "".join(texts) == PLAIN.text
    assert [block.model_dump() for block in final.content] == [block.model_dump() for block in whole.content]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == whole.usage.output_tokens
    prompt = whole.usage.input_tokens + whole.usage.cache_read_input_tokens
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == prompt  # from message_delta


def test_a_stop_sequence_ends_the_text_and_is_named(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER], stop_sequences=["scripted"])

    assert message.content[0].text == PLAIN.text[: PLAIN.text.index("scripted")]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "scripted")


def test_a_tool_use_tool_result_round_trip(client: anthropic.Anthropic) -> None:
    messages: list = [USER]
    first = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=messages, tools=TOOLS)
    assert first.stop_reason == "tool_use"
    text, call = first.content
    assert (text.type, text.text) == ("text", STEPS[0].content)
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"}) and call.id
    # As agent code does: the SDK's own blocks go back into the conversation.
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": "sunny"}]}
    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
    second = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=messages, tools=TOOLS)
    assert second.stop_reason == "tool_use"
    assert [(b.type, b.name, b.input) for b in second.content] == [("tool_use", "get_time", {"city": "Paris"})]
    result = {"type": "tool_result", "tool_use_id": second.content[0].id, "content": "12:00"}
    messages += [{"role": "assistant", "content": second.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=messages, tools=TOOLS)
    assert answer.stop_reason == "end_turn"
    assert [(b.type, b.text) for b in answer.content] == [("text", STEPS[2].content)]


def test_a_streamed_tool_use_accumulates_into_the_call(client: anthropic.Anthropic) -> None:
    whole = client.messages.create(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER], tools=TOOLS)
    with client.messages.stream(model=SCRIPTED_MODEL, max_tokens=64, messages=[USER], tools=TOOLS) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]

    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use"
    assert "input_json_delta" in [getattr(getattr(e, "delta", None), "type", None) for e in events]

    def without_ids(blocks: list) -> list[dict]:
        return [block.model_dump(exclude={"id"}) for block in blocks]  # each call gets its own id

    assert without_ids(final.content) == without_ids(whole.content)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_is_called_with_input_valid_for_its_schema(client: anthropic.Anthropic, stream: bool) -> None:
    """The chat route's forced-call test, through this API: the same prompt, the same seeded sampling."""
    params = dict(
        model=TINY_MODEL,
        max_tokens=120,
        messages=[USER],
        tools=ENUM_TOOLS,
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
        extra_body={"temperature": 1.0, "seed": 4},  # seed: Arbor's extension
    )
    if stream:
        with client.messages.stream(**params) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**params)

    assert message.stop_reason == "tool_use", message.content
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_time"
    jsonschema.validate(call.input, ENUM_CITY)
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "12:00", "is_error": False}
    turns = [USER, {"role": "assistant", "content": message.content}, {"role": "user", "content": [result]}]
    answer = client.messages.create(model=TINY_MODEL, max_tokens=8, messages=turns, tools=ENUM_TOOLS)
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_the_thinking_budget_bounds_the_thinking_block(client: anthropic.Anthropic, thinker: Path) -> None:
    """Greedy, so both runs think the same thoughts: the budget cuts them short and the answer follows."""

    def blocks_of(budget: int) -> list:
        return client.messages.create(
            model=THINKER,
            max_tokens=40,
            messages=[{"role": "user", "content": "Think, then answer."}],
            thinking={"type": "enabled", "budget_tokens": budget},
            extra_body={"temperature": 0.0},  # greedy (this SDK no longer sends temperature itself)
        ).content

    bounded, unbounded = blocks_of(5), blocks_of(1000)

    assert [block.type for block in bounded] == ["thinking", "text"] and bounded[0].signature == ""
    assert [block.type for block in unbounded] == ["thinking"]  # thought for all 40 tokens
    assert unbounded[0].thinking.startswith(bounded[0].thinking)
    assert len(bounded[0].thinking) < len(unbounded[0].thinking)
    assert bounded[1].text.startswith("\n\n")  # after the close tag the budget forced


def test_thinking_disabled_has_no_thinking_block(client: anthropic.Anthropic, thinker: Path) -> None:
    message = client.messages.create(
        model=THINKER,
        max_tokens=12,
        extra_body={"temperature": 0.0},  # greedy (this SDK no longer sends temperature itself)
        messages=[{"role": "user", "content": "Answer at once."}],
        thinking={"type": "disabled"},
    )

    assert [block.type for block in message.content] in (["text"], [])


@pytest.mark.parametrize("model", [SCRIPTED_MODEL, THINKER])
def test_count_tokens_equals_the_input_a_message_reports(client: anthropic.Anthropic, thinker: Path, model) -> None:
    params = dict(
        model=model,
        system=[{"type": "text", "text": f"Session {uuid.uuid4()}.", "cache_control": {"type": "ephemeral"}}],
        messages=[USER, {"role": "assistant", "content": "Let me check."}, {"role": "user", "content": "Go on."}],
        tools=TOOLS,
        thinking={"type": "enabled", "budget_tokens": 4},
    )

    counted = client.messages.count_tokens(**params)
    message = client.messages.create(max_tokens=4, **params)

    assert counted.input_tokens > 0
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_a_repeated_prompt_reports_cached_tokens_on_both_apis(client: anthropic.Anthropic, stack: Stack) -> None:
    system = f"{uuid.uuid4()} {LONG_SYSTEM}"  # new to the prefill cache
    first = client.messages.create(model=TINY_MODEL, max_tokens=2, system=system, messages=[USER])
    second = client.messages.create(model=TINY_MODEL, max_tokens=2, system=system, messages=[USER])
    openai = stack.openai()
    chat_messages = [{"role": "system", "content": f"{uuid.uuid4()} {LONG_SYSTEM}"}, USER]
    chat_first = openai.chat.completions.create(model=TINY_MODEL, max_tokens=2, messages=chat_messages)
    chat_second = openai.chat.completions.create(model=TINY_MODEL, max_tokens=2, messages=chat_messages)

    assert first.usage.cache_read_input_tokens == 0 and second.usage.cache_read_input_tokens > 0
    total = first.usage.input_tokens
    assert second.usage.input_tokens + second.usage.cache_read_input_tokens == total
    assert chat_first.usage.prompt_tokens_details.cached_tokens == 0
    cached = chat_second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < chat_second.usage.prompt_tokens


def test_aliases_are_listed_and_served(client: anthropic.Anthropic, stack: Stack, thinker: Path) -> None:
    cards = {card.id: card for card in stack.openai().models.list()}

    message = client.messages.create(model=ALIASES[1], max_tokens=4, messages=[USER])

    assert {THINKER, *ALIASES} <= set(cards)
    assert all(cards[alias].model_extra["root"] == THINKER for alias in ALIASES)
    assert message.model == THINKER and message.usage.output_tokens > 0


def test_bad_input_is_a_bad_request_naming_the_field(client: anthropic.Anthropic) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model=SCRIPTED_MODEL, max_tokens=8, messages=[{"role": "user", "content": [image]}])
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert (
        "messages.0.content" in caught.value.body["error"]["message"]
        and "image" in caught.value.body["error"]["message"]
    )
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-opus-4-1", max_tokens=8, messages=[USER])


# A request as Claude Code sends it (recorded shape, texts shortened): the beta query string and
# headers, system blocks with cache_control, tools with JSON schemas, an earlier turn's thinking
# replayed with its signature, a tool_use / tool_result pair, metadata, 32000 max_tokens.
CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14",
    "anthropic-dangerous-direct-browser-access": "true",
    "x-app": "cli",
    "user-agent": "claude-cli/2.0.14 (external, cli)",
    "x-stainless-lang": "js",
}
CLAUDE_CODE_BODY = {
    "model": ALIASES[0],
    "max_tokens": 32000,
    "stream": True,
    "system": [
        {
            "type": "text",
            "text": "You are Claude Code, Anthropic's official CLI for Claude.",
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "text", "text": "You are an interactive CLI tool that helps users with software engineering tasks."},
    ],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>This is a reminder.</system-reminder>"},
                {"type": "text", "text": "List the files here.", "cache_control": {"type": "ephemeral"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "I should run ls.", "signature": "EqQBCkgIBxABGAIiQL2s0m=="},
                {"type": "text", "text": "I'll list them."},
                {"type": "tool_use", "id": "toolu_01A09q90qw90lq917835lq9", "name": "Bash", "input": {"command": "ls"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_01A09q90qw90lq917835lq9",
                    "content": [{"type": "text", "text": "README.md\nsrc"}],
                    "is_error": False,
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        },
    ],
    "tools": [
        {
            "name": "Bash",
            "description": "Executes a given bash command in a persistent shell session.",
            "input_schema": {
                "type": "object",
                "properties": {
                    "command": {"type": "string", "description": "The command to execute"},
                    "timeout": {"type": "number", "description": "Optional timeout in milliseconds"},
                },
                "required": ["command"],
                "additionalProperties": False,
                "$schema": "http://json-schema.org/draft-07/schema#",
            },
        },
        {
            "name": "mcp__ide__getDiagnostics",
            "description": "Get language diagnostics from VS Code",
            "input_schema": {
                "type": "object",
                "properties": {"uri": {"type": "string"}},
                "additionalProperties": False,
            },
        },
    ],
    "tool_choice": {"type": "auto"},
    "metadata": {"user_id": "user_2f1e_account__session_5c0d"},
    "thinking": {"type": "enabled", "budget_tokens": 31999},
    "temperature": 1,
}


def test_a_request_in_claude_codes_shape_is_served(stack: Stack, thinker: Path) -> None:
    with (
        stack.http() as http,
        http.stream(
            "POST", "/v1/messages?beta=true", json=CLAUDE_CODE_BODY, headers=CLAUDE_CODE_HEADERS | {"x-api-key": "x"}
        ) as response,
    ):
        assert response.status_code == 200, response.read()
        frames = response.read().decode().split("\n\n")[:-1]

    names = [frame.split("\n")[0].removeprefix("event: ") for frame in frames]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    message_delta = json.loads(frames[-2].split("\n")[1].removeprefix("data: "))
    assert message_delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
