"""The scripted checkpoint (tests/support/scripted_model.py) emits exactly its script, in process.

The live-stack tests rely on it, so its determinism is checked here first, through the same
loader, chat template and decoder the worker runs (no Redis, no HTTP).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared.sampling import SamplingParams
from tests.support.scripted_model import EOS, PLAIN, STEPS, TOOLS, TURNS, ScriptedTurn, make_scripted_model
from worker.chat.tool_calls import ToolCallParser
from worker.engine.generate import generate
from worker.serving_model import ServingModel, load_serving_model


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> ServingModel:
    folder = make_scripted_model(tmp_path_factory.mktemp("scripted") / "scripted")
    return load_serving_model(folder, "ngram")


def conversation_before(step: int) -> list[dict]:
    """A conversation with `step` assistant turns, each followed by tool results (or a user turn)."""
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
    for turn in STEPS[:step]:
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
            for i, c in enumerate(turn.calls)
        ]
        messages.append({"role": "assistant", "content": turn.content or None, "tool_calls": calls or None})
        messages += [{"role": "tool", "tool_call_id": call["id"], "content": "ok"} for call in calls]
        if not calls:
            messages.append({"role": "user", "content": "And in Tokyo?"})
    return messages


def _run(served: ServingModel, messages: list[dict], tools: list[dict] | None, **params) -> tuple[str, list[int]]:
    prompt_ids = served.encode_chat(messages, tools)
    result = generate(served.runner, served.tokenizer, prompt_ids, SamplingParams(max_tokens=32, **params))
    assert result.finish_reason == "stop"
    return result.text, result.token_ids


def _expected_ids(served: ServingModel, turn: ScriptedTurn) -> list[int]:
    return [served.tokenizer.token_to_id(piece) for piece in (*turn.pieces, EOS)]


@pytest.mark.parametrize("step", range(len(STEPS)))
def test_each_step_emits_its_script_token_by_token(scripted: ServingModel, step: int) -> None:
    text, token_ids = _run(scripted, conversation_before(step), TOOLS)
    assert text == STEPS[step].text
    assert token_ids == _expected_ids(scripted, STEPS[step])


def test_without_tools_the_model_answers_plainly(scripted: ServingModel) -> None:
    text, token_ids = _run(scripted, conversation_before(2), None)
    assert (text, token_ids) == (PLAIN.text, _expected_ids(scripted, PLAIN))


def test_script_is_followed_under_sampling_too(scripted: ServingModel) -> None:
    # The winning logit is 240 above the rest: even temperature 1 cannot leave the script.
    text, _ = _run(scripted, conversation_before(0), TOOLS, temperature=1.0, seed=7)
    assert text == STEPS[0].text


def test_steps_past_the_script_repeat_the_last_one(scripted: ServingModel) -> None:
    messages = conversation_before(len(STEPS)) + [{"role": "user", "content": "Once more?"}]
    text, _ = _run(scripted, messages, TOOLS)
    assert text == STEPS[-1].text


@pytest.mark.parametrize("turn", TURNS, ids=lambda turn: turn.marker)
def test_script_parses_into_the_declared_content_and_calls(turn: ScriptedTurn) -> None:
    parser = ToolCallParser()
    content = "".join(parser.feed(piece).content for piece in turn.pieces) + parser.flush().content
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parser.finish()]
    assert content == turn.content
    assert calls == [(c.name, c.arguments) for c in turn.calls]


def test_checkpoint_is_a_plain_hf_llama_folder(tmp_path: Path) -> None:
    folder = make_scripted_model(tmp_path / "m")
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["max_position_embeddings"] == 4096
