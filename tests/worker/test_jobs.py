"""Stream entry -> JobSpec: chat template with tools and kwargs, output options, poison and refusals."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from shared.protocol import ErrorCode, Job, JobState
from tests.support.tiny_models import make_tiny_model
from worker.chat.template import ChatTemplate
from worker.redis_side.jobs import FORCED_CLOSE, JobRejected, PoisonJob, build_spec, parse_job
from worker.serving_model import ServingModel, load_serving_model

TEMPLATES = Path(__file__).parent / "chat" / "templates"
THINKING = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n<think>\n"
)
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city", "parameters": CITY}}
]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> ServingModel:
    folder = make_tiny_model(tmp_path_factory.mktemp("jobs") / "tiny", max_position_embeddings=2048)
    return load_serving_model(folder, "none")


def with_template(model: ServingModel, source: str) -> ServingModel:
    return ServingModel(
        model.name, "none", model.loaded, model.runner, ChatTemplate(source, model.loaded.checkpoint.special_tokens)
    )


def job(body: dict | str, kind: str = "chat") -> Job:
    return Job(
        id="chatcmpl-1",
        model="tiny",
        kind=kind,
        body=body if isinstance(body, str) else json.dumps(body),
        created=time.time(),
        deadline=time.time() + 60,
    )


def spec_of(model: ServingModel, body: dict | str, kind: str = "chat", max_lanes: int = 4):
    return build_spec(
        job(body, kind), "1-0", 1, JobState(worker="w", attempt=1, emitted_token_ids=[]), model, max_lanes
    )


def prompt_text(model: ServingModel, spec) -> str:
    return model.tokenizer.decode(spec.prompt_ids, skip_special_tokens=False)


def test_chat_with_text_parts_tools_and_template_kwargs(base):
    model = with_template(base, (TEMPLATES / "qwen3.jinja").read_text())
    body = {
        "model": "tiny",
        "max_tokens": 8,
        "tools": TOOLS,
        "chat_template_kwargs": {"enable_thinking": False},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]}
        ],
    }
    spec = spec_of(model, body)
    text = prompt_text(model, spec)
    assert "Weather in\nParis?" in text  # parts joined with a newline
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # enable_thinking=False reached it
    assert spec.output.parse_tool_calls and spec.output.reasoning is not None
    assert not spec.output.reasoning.starts_in_reasoning
    assert spec.params.max_tokens == 8 and spec.n == 1


def test_tool_choice_none_renders_no_tools_and_parses_none(base):
    model = with_template(base, (TEMPLATES / "qwen3.jinja").read_text())
    body = {"model": "tiny", "tools": TOOLS, "tool_choice": "none", "messages": [{"role": "user", "content": "Hi"}]}
    spec = spec_of(model, body)
    assert "<tools>" not in prompt_text(model, spec) and not spec.output.parse_tool_calls


def test_earlier_tool_calls_reach_the_template_as_objects(base):
    model = with_template(base, (TEMPLATES / "qwen3.jinja").read_text())
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    text = prompt_text(model, spec_of(model, {"model": "tiny", "messages": messages}))
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text


def test_a_template_that_opens_the_think_tag_starts_in_reasoning_with_a_budget(base):
    model = with_template(base, THINKING)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low"}
    reasoning = spec_of(model, body).output.reasoning
    assert reasoning.starts_in_reasoning and reasoning.budget == 1024
    assert model.tokenizer.decode(list(reasoning.close_ids)) == FORCED_CLOSE


def test_a_completion_encodes_the_raw_prompt_and_asks_for_logprobs(base):
    spec = spec_of(
        base, {"model": "tiny", "prompt": "The quick brown fox", "logprobs": 3, "stop": "dog"}, kind="completion"
    )
    assert spec.prompt_ids == base.encode_text("The quick brown fox")
    assert spec.output.num_logprobs == 3 and spec.output.stop == ("dog",) and spec.output.reasoning is None
    assert not spec.output.include_stop
    kept = spec_of(
        base, {"model": "tiny", "prompt": "x", "stop": "dog", "include_stop_str_in_output": True}, kind="completion"
    )
    assert kept.output.include_stop
    assert spec.params.max_tokens == base.runner.max_context - len(spec.prompt_ids)  # silent: the rest of the context


def test_a_completion_of_token_ids_uses_them_as_they_are(base):
    ids = base.encode_text("The quick brown fox")[::-1]  # not what encoding any text gives, BOS or not
    for prompt in (ids, [ids]):
        spec = spec_of(base, {"model": "tiny", "prompt": prompt, "max_tokens": 4}, kind="completion")
        assert spec.prompt_ids == ids
    with pytest.raises(JobRejected) as caught:
        spec_of(base, {"model": "tiny", "prompt": [1, base.runner.vocab_size]}, kind="completion")
    assert caught.value.code == ErrorCode.INVALID_REQUEST and "vocabulary" in str(caught.value)


@pytest.mark.parametrize("body", ["{not json", {"model": "tiny", "messages": []}, {"model": "tiny", "prompt": "x"}])
def test_malformed_bodies_are_poison(base, body):
    with pytest.raises(PoisonJob) as caught:
        spec_of(base, body)
    assert caught.value.request_id == "chatcmpl-1" and caught.value.code == ErrorCode.INVALID_REQUEST


def test_a_malformed_entry_is_poison_with_whatever_id_it_has():
    with pytest.raises(PoisonJob) as caught:
        parse_job({"id": "x-1", "model": "tiny"})
    assert caught.value.request_id == "x-1"
    with pytest.raises(PoisonJob) as caught:
        parse_job({"garbage": "1"})
    assert caught.value.request_id is None


def test_requests_this_worker_cannot_serve_are_rejected_with_their_code(base):
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(JobRejected) as caught:
        spec_of(base, {"model": "tiny", "messages": messages, "n": 5}, max_lanes=4)
    assert caught.value.code == ErrorCode.INVALID_REQUEST
    long = [{"role": "user", "content": "Hi " * base.runner.max_context}]
    with pytest.raises(JobRejected) as caught:
        spec_of(base, {"model": "tiny", "messages": long, "max_tokens": 1})
    assert caught.value.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert "the prompt is" in str(caught.value) and f"{base.runner.max_context} tokens" in str(caught.value)


def test_logit_bias_reaches_the_sampler_and_ids_outside_the_vocabulary_are_rejected(base):
    messages = [{"role": "user", "content": "Hi"}]
    vocab_size = base.runner.vocab_size
    spec = spec_of(base, {"model": "tiny", "messages": messages, "logit_bias": {"5": -100, str(vocab_size - 1): 2.5}})
    assert spec.params.logit_bias == {5: -100.0, vocab_size - 1: 2.5}
    with pytest.raises(JobRejected) as caught:
        spec_of(base, {"model": "tiny", "messages": messages, "logit_bias": {str(vocab_size): 1}})
    assert caught.value.code == ErrorCode.INVALID_REQUEST and "logit_bias" in str(caught.value)


def test_a_constraint_starts_after_the_think_block_when_the_prompt_opened_one(base):
    messages = [{"role": "user", "content": "Hi"}]
    json_mode = {"model": "tiny", "messages": messages, "response_format": {"type": "json_object"}}
    # A prompt that closed (or never opened) the think block: JSON from the first token.
    spec = spec_of(base, json_mode | {"chat_template_kwargs": {"enable_thinking": False}})
    assert spec.params.structured is not None and spec.params.constraint_after is None
    assert spec_of(base, json_mode | {"reasoning_budget": 8}).params.constraint_after is None
    thinking = spec_of(with_template(base, THINKING), json_mode)
    assert thinking.output.reasoning is not None and thinking.output.reasoning.starts_in_reasoning
    assert thinking.params.constraint_after == "</think>"


def test_a_constrained_job_has_its_grammar_compiled_before_it_reaches_the_owner(base):
    messages = [{"role": "user", "content": "Hi"}]
    spec = spec_of(base, {"model": "tiny", "messages": messages, "guided_regex": "[ab]{3}"})
    assert spec.params.structured is not None
    assert base.runner.grammar_masks.is_compiled(spec.params.structured.check())


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_above_the_room_the_prompt_leaves_is_lowered_to_it(base, field):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], field: 10_000}
    spec = spec_of(base, body)
    room = base.runner.max_context - len(spec.prompt_ids)
    assert spec.params.max_tokens == room
    assert spec_of(base, body | {field: 5}).params.max_tokens == 5  # fits: kept


def test_a_completion_max_tokens_is_lowered_too(base):
    spec = spec_of(base, {"model": "tiny", "prompt": "Hi", "max_tokens": 10_000}, kind="completion")
    assert spec.params.max_tokens == base.runner.max_context - len(spec.prompt_ids)


def test_a_count_job_is_prepared_even_past_the_context(base):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi " * 3000}], "max_tokens": 1}
    spec = spec_of(base, body, kind="count")
    assert spec.kind == "count" and len(spec.prompt_ids) > base.runner.max_context
