"""`arbor bench agent --recorded`: Claude Code's recorded conversation replayed through the real
stack (embedded Redis, gateway, a worker) on a tiny random model, through /v1/messages and
translated to /v1/chat/completions. No timings are asserted: the prompts each API reports, the
prefill cache's hits per turn, and the report's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.messages_api.request import MessagesRequest
from gateway.messages_api.translate import to_chat_request
from ops.bench.agent_recorded import TurnSettings, chat_conversation, load_recording
from ops.bench.agent_recorded_run import replay_order
from ops.cli import main
from shared.openai_schema import Limits
from tests.support.tiny_models import make_tiny_model
from worker.serving.prefix_cache import DEFAULT_BLOCK_TOKENS

MAX_TOKENS = 4


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    # Claude Code's system prompt is ~16K characters: ~10K tokens of the tiny tokenizer
    return make_tiny_model(tmp_path_factory.mktemp("recorded") / "tiny-qwen3", max_position_embeddings=32768)


def test_recorded_conversation_replays_cold_then_warm_on_both_apis(tiny_model, tmp_path):
    argv = ["bench", "agent", "--recorded", "claude-code", "--model", str(tiny_model), "--speculation", "none"]
    argv += ["--repeats", "1", "--max-tokens", str(MAX_TOKENS), "--worker-threads", "1", "--ready-timeout", "120"]
    assert main([*argv, "--run-timeout", "600", "--out", str(tmp_path)]) == 0
    names = {path.name for path in tmp_path.iterdir()}
    assert {"agent-recorded.json", "agent-recorded.md", "gateway.log", "worker-1.log", "worker-1-2-none.log"} <= names
    report = json.loads((tmp_path / "agent-recorded.json").read_text())
    assert report["total_errors"] == 0
    assert report["settings"]["source"] == "tests/fixtures/agent_traffic/claude-code-2.1.332"
    (mode,) = report["modes"]
    assert mode["mode"] == "none" and [api["api"] for api in mode["apis"]] == ["messages", "chat"]
    prompts = {}
    for api in mode["apis"]:
        (replay,) = api["replays"]
        assert [turn["turn"] for turn in replay] == [1, 2, 3, 4] and all(turn["ok"] for turn in replay)
        assert all(turn["completion_tokens"] == MAX_TOKENS for turn in replay), "EOS ignored: every turn decodes all"
        prompt, cached = [turn["prompt_tokens"] for turn in replay], [turn["cached_tokens"] for turn in replay]
        assert cached[0] == 0, f"{api['api']}: turn 1 found a cache the worker's restart should have emptied"
        for before, after, hit in zip(prompt[:-1], prompt[1:], cached[1:], strict=True):
            # turn k+1's prompt starts with turn k's: all of it but the last partial blocks is a hit
            assert before < after and before - 2 * DEFAULT_BLOCK_TOKENS <= hit < after, (api["api"], prompt, cached)
        prompts[api["api"]] = prompt
        assert [turn["min_cached_tokens"] for turn in api["turns"]] == cached
        assert api["cold_ttft_ms"] == api["turns"][0]["ttft_ms"] > 0 and api["warm_ttft_ms"] > 0
        assert all(turn["decode_tokens_per_s"] > 0 for turn in replay)
    assert prompts["messages"] == prompts["chat"], "both APIs render the same conversation into the same prompt"
    markdown = (tmp_path / "agent-recorded.md").read_text()
    assert "| none | messages | 1 | " in markdown and "| none | chat | 4 | " in markdown
    assert "## Cold turn 1 against warm turns 2+" in markdown


def test_chat_translation_makes_the_gateways_chat_request():
    """The bench's own translation of each recorded turn is the conversation the messages route
    enqueues for the same body: the same messages and tools."""
    recording = load_recording("claude-code")
    settings = TurnSettings("SmolLM2-135M-Instruct", 16, 0.0)
    for turn in range(len(recording.bodies)):
        body = recording.messages_body(turn, settings)
        gateway = to_chat_request(MessagesRequest.model_validate(body), Limits(1 << 20, 8, 8)).model_dump(
            mode="json", exclude_none=True
        )
        ours = chat_conversation(body)
        assert ours["messages"] == gateway["messages"]
        assert len(ours["tools"]) == 12 and ours["tools"] == gateway["tools"]
        assert recording.chat_body(turn, settings)["max_tokens"] == body["max_tokens"] == 16


def test_chat_translation_of_tool_calls_results_and_thinking():
    body = {
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "List "}, {"type": "text", "text": "files."}]},
            {"role": "system", "content": "cwd: /tmp"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "ls", "signature": ""},
                    {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                ],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]},
        ],
        "tools": [{"name": "Bash", "input_schema": {"type": "object"}}, {"name": "web", "type": "web_search_1"}],
    }
    call = {"id": "t1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}}
    assert chat_conversation(body) == {
        "messages": [
            {"role": "system", "content": "Be brief.\n\ncwd: /tmp"},
            {"role": "user", "content": "List \nfiles."},
            {"role": "assistant", "content": None, "reasoning_content": "ls", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        ],
        "tools": [{"type": "function", "function": {"name": "Bash", "parameters": {"type": "object"}}}],
    }
    with pytest.raises(ValueError, match="'image'"):
        chat_conversation({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})


def test_bench_agent_refuses_an_unknown_recording_in_one_line(tmp_path, capsys):
    assert main(["bench", "agent", "--recorded", "no-such-agent", "--out", str(tmp_path)]) == 2
    assert "--recorded='no-such-agent'" in capsys.readouterr().err


def test_replay_order_alternates_which_api_and_mode_go_first():
    order = replay_order(["none", "auto"], 2)
    assert [(mode, api) for _, mode, api in order] == [
        ("none", "messages"), ("none", "chat"), ("auto", "chat"), ("auto", "messages"),
        ("auto", "messages"), ("auto", "chat"), ("none", "chat"), ("none", "messages"),
    ]  # fmt: skip
    assert [round_index for round_index, _, _ in order] == [0] * 4 + [1] * 4
    alone = [api for _, _, api in replay_order(["none"], 2)]
    assert alone == ["messages", "chat", "chat", "messages"]
