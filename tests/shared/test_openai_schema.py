"""Request validation: what vLLM users send is handled or refused by name; what no field of
Arbor's is named is left aside, with its path, for the gateway to log and count."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from shared.openai_schema import (
    REASONING_EFFORT_BUDGETS,
    ChatCompletionRequest,
    CompletionRequest,
    Limits,
    UnsupportedField,
    limits_context,
    to_sampling_params,
)
from shared.request_fields import take_unknown
from shared.structured_output import StructuredOutput

LIMITS = limits_context(Limits(max_tokens=1000, max_n=4, max_prompts=64))
USER = [{"role": "user", "content": "hi"}]


def chat(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER} | fields, context=LIMITS)


def refused(model=ChatCompletionRequest, **fields) -> tuple[str, str]:
    """(param, message) of the first error, the way the gateway reports it."""
    base = {"model": "m", "messages": USER} if model is ChatCompletionRequest else {"model": "m", "prompt": "p"}
    with pytest.raises(ValidationError) as caught:
        model.model_validate(base | fields, context=LIMITS)
    error = caught.value.errors()[0]
    cause = error.get("ctx", {}).get("error")
    param = cause.param if isinstance(cause, UnsupportedField) else ".".join(map(str, error["loc"]))
    return param, error["msg"]


def test_a_full_vllm_style_chat_request_is_accepted() -> None:
    req = chat(
        messages=[
            {"role": "developer", "content": "rules"},
            {
                "role": "system",
                "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "kind"}],
            },
            {"role": "user", "content": "weather?", "name": "ann"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ],
        tools=[{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        tool_choice="auto",
        parallel_tool_calls=True,
        stream=True,
        stream_options={"include_usage": True},
        n=2,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        seed=3,
        stop=["</s>", "\n\n"],
        max_completion_tokens=100,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.1,
        logprobs=True,
        top_logprobs=5,
        user="u",
        chat_template_kwargs={"enable_thinking": True},
        reasoning_budget=512,
        ignore_eos=False,
        stop_token_ids=[7],
        response_format={"type": "text"},
        logit_bias={"50256": -100, "7": 2},
        store=False,
        metadata={"team": "search"},
        service_tier="auto",
        modalities=["text"],
        safety_identifier="hashed-user",
    )

    assert req.include_usage and req.requested_max_tokens() == 100 and req.reasoning_budget_tokens() == 512
    params = to_sampling_params(req)
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed) == (
        0.7,
        0.9,
        40,
        0.05,
        3,
    )
    assert (params.max_tokens, params.stop, params.stop_token_ids) == (100, ["</s>", "\n\n"], [7])
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.1, 0.2, 1.1)
    assert params.logit_bias == {50256: -100.0, 7: 2.0}
    assert params.structured is None


def test_json_object_response_format_is_json_mode_for_the_sampler() -> None:
    assert to_sampling_params(chat(response_format={"type": "json_object"})).structured == StructuredOutput(
        "json_object", "", "response_format"
    )
    assert to_sampling_params(chat(response_format={"type": "text"})).structured is None


SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}


@pytest.mark.parametrize(
    ("fields", "kind", "field"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}},
            "json_schema",
            "response_format.json_schema.schema",
        ),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "c", "schema": SCHEMA, "strict": False},
                }
            },
            "json_schema",
            "response_format.json_schema.schema",
        ),
        ({"guided_json": SCHEMA}, "json_schema", "guided_json"),
        ({"guided_json": '{"type": "object"}'}, "json_schema", "guided_json"),
        ({"guided_regex": "[0-9]+"}, "regex", "guided_regex"),
        ({"guided_choice": ["yes", "no"]}, "choice", "guided_choice"),
        ({"guided_grammar": 'root ::= "a"'}, "grammar", "guided_grammar"),
        ({"structured_outputs": {"json": SCHEMA}}, "json_schema", "structured_outputs.json"),
        ({"structured_outputs": {"regex": "a+"}}, "regex", "structured_outputs.regex"),
        ({"structured_outputs": {"choice": ["x"]}}, "choice", "structured_outputs.choice"),
        ({"structured_outputs": {"grammar": 'start: "a"'}}, "grammar", "structured_outputs.grammar"),
        ({"structured_outputs": {"json_object": True}}, "json_object", "structured_outputs.json_object"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, "tool_call", "tool_choice"),
        (
            {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
            "tool_call",
            "tool_choice",
        ),
    ],
)
def test_each_structured_output_reaches_the_sampler(fields: dict, kind: str, field: str) -> None:
    structured = to_sampling_params(chat(**fields)).structured
    assert structured is not None and (structured.kind, structured.field) == (kind, field)
    structured.check()


def test_a_forced_tool_call_names_its_functions_and_whether_calls_may_repeat() -> None:
    other = {"type": "function", "function": {"name": "noop"}}
    required = chat(tools=[WEATHER_TOOL, other], tool_choice="required").forced_tool_call()
    assert required is not None
    spec = json.loads(required.spec)
    assert [f["name"] for f in spec["functions"]] == ["get_weather", "noop"] and spec["parallel"]
    single = chat(tools=[WEATHER_TOOL, other], tool_choice="required", parallel_tool_calls=False).forced_tool_call()
    assert single is not None and not json.loads(single.spec)["parallel"]
    named = chat(tools=[WEATHER_TOOL, other], tool_choice={"type": "function", "function": {"name": "noop"}})
    forced = named.forced_tool_call()
    assert forced is not None and json.loads(forced.spec) == {
        "functions": [{"name": "noop", "parameters": None}],
        "parallel": False,
    }


def test_completions_take_the_same_constraints() -> None:
    request = CompletionRequest.model_validate({"model": "m", "prompt": "x", "guided_regex": "[ab]+"})
    assert request.structured_output() == StructuredOutput("regex", "[ab]+", "guided_regex")
    request = CompletionRequest.model_validate(
        {"model": "m", "prompt": "x", "response_format": {"type": "json_object"}}
    )
    assert to_sampling_params(request).structured is not None


def test_defaults_follow_openai() -> None:
    params = to_sampling_params(chat(), default_max_tokens=77)

    assert params.temperature == 1.0 and params.top_p == 1.0 and params.top_k == 0
    assert params.max_tokens == 77 and params.stop == [] and not params.greedy


def test_min_tokens_reaches_the_sampler_and_a_defaulted_max_tokens_caps_it() -> None:
    assert to_sampling_params(chat(min_tokens=5, max_tokens=10)).min_tokens == 5
    assert to_sampling_params(chat(min_tokens=50), default_max_tokens=20).min_tokens == 20
    assert to_sampling_params(chat()).min_tokens == 0


def test_integers_are_fine_where_floats_are_expected() -> None:
    assert to_sampling_params(chat(temperature=1, top_p=1)).temperature == 1.0


def test_top_k_minus_one_means_off() -> None:
    assert to_sampling_params(chat(top_k=-1)).top_k == 0


@pytest.mark.parametrize(("effort", "budget"), sorted(REASONING_EFFORT_BUDGETS.items()))
def test_reasoning_effort_maps_to_a_budget(effort: str, budget: int) -> None:
    assert chat(reasoning_effort=effort).reasoning_budget_tokens() == budget


def test_no_reasoning_budget_means_unbounded() -> None:
    assert chat().reasoning_budget_tokens() is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "function": {"name": "w"}}}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "w"}}}, "tool_choice"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required", "min_tokens": 2}, "min_tokens"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
            "response_format.json_schema.schema",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}},
            "response_format.json_schema.name",
        ),
        ({"guided_json": {"type": "array", "uniqueItems": True}}, "guided_json"),
        ({"guided_json": "{not json"}, "guided_json"),
        ({"guided_regex": "a(b"}, "guided_regex"),
        ({"guided_choice": []}, "guided_choice"),
        ({"guided_grammar": "root ::= missing"}, "guided_grammar"),
        ({"guided_regex": "a+", "guided_choice": ["a"]}, "guided_choice"),
        ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex"),
        ({"structured_outputs": {"structural_tag": "x"}}, "structured_outputs.structural_tag"),
        ({"top_logprobs": 3}, "top_logprobs"),
        ({"reasoning_budget": 10, "reasoning_effort": "low"}, "reasoning_effort"),
        ({"logit_bias": {"a": 2.0}}, "logit_bias"),
        ({"logit_bias": {"-1": 2.0}}, "logit_bias"),
        ({"logit_bias": {"7": 100.5}}, "logit_bias"),
        ({"logit_bias": {"7": "2"}}, "logit_bias.7"),
        ({"response_format": {"type": "json_schema"}}, "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"response_format": {"type": "text", "json_schema": {"name": "x"}}}, "response_format"),
        (
            {"response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "w"}}]},
            "response_format",
        ),
        ({"response_format": {"type": "json_object"}, "min_tokens": 1}, "min_tokens"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"n": 5}, "n"),
        ({"stop": ["ok", ""]}, "stop"),
        ({"seed": "lucky"}, "seed"),
        ({"max_tokens": "5"}, "max_tokens"),  # strict: numbers in strings are a client bug
        ({"stream": "true"}, "stream"),
        ({"store": True}, "store"),
        ({"service_tier": "flex"}, "service_tier"),
        ({"modalities": ["text", "audio"]}, "modalities"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"min_tokens": 11, "max_tokens": 10}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.tool.tool_call_id"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0"),
    ],
)
def test_refused_chat_fields_are_named(fields: dict, param: str) -> None:
    assert refused(**fields)[0] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo or prompt_logprobs
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"prompt": ["a"] * 65}, "prompt"),  # over LIMITS' max_prompts
        ({"prompt": []}, "prompt"),
        ({"prompt": [[]]}, "prompt"),
        ({"prompt": [5, -1]}, "prompt"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_refused_completion_fields_are_named(fields: dict, param: str) -> None:
    assert refused(CompletionRequest, **fields)[0] == param


def test_prompt_logprobs_are_asked_by_echo_with_logprobs_or_prompt_logprobs() -> None:
    def num(**fields) -> int | None:
        return CompletionRequest.model_validate({"model": "m", "prompt": "p", **fields}).num_prompt_logprobs()

    assert num(echo=True, logprobs=1, max_tokens=0) == 1
    assert num(logprobs=5) is None and num(echo=True) is None  # generated tokens' only; echo's text only
    assert num(prompt_logprobs=0) == 0 and num(echo=True, logprobs=2, prompt_logprobs=4) == 4
    req = CompletionRequest.model_validate({"model": "m", "prompt": "p", "echo": True, "max_tokens": 0})
    assert to_sampling_params(req, default_max_tokens=16).max_tokens == 0


@pytest.mark.parametrize("prompt", [["a", [1]], 5, [1.5], [["a"]], [True], [[1, "x"]], {"a": 1}])
def test_a_prompt_of_the_wrong_shape_is_one_error(prompt) -> None:
    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    (error,) = caught.value.errors()
    assert error["loc"] == ("prompt",) and "list of token ids" in error["msg"]


def test_completion_prompt_forms() -> None:
    assert CompletionRequest(model="m", prompt="a").prompt_value() == "a"
    assert CompletionRequest(model="m", prompt=["b"], best_of=1, echo=False).prompt_value() == "b"
    assert CompletionRequest(model="m", prompt=[3, 1, 2]).prompt_value() == [3, 1, 2]
    assert CompletionRequest(model="m", prompt=[[3, 1]]).prompt_value() == [3, 1]
    batch = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"], "n": 2}, context=LIMITS)
    second = batch.one_per_prompt()[1]
    assert batch.prompts() == ["a", "b"] and second.prompt_value() == "b" and second.n == 2
    assert CompletionRequest(model="m", prompt=[[3, 1], [2]]).prompts() == [[3, 1], [2]]


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_over_the_cap_is_lowered_to_it(field: str) -> None:
    assert chat(**{field: 32000}).requested_max_tokens() == 1000
    assert chat(**{field: 999}).requested_max_tokens() == 999


def test_limits_are_not_rechecked_without_a_context() -> None:
    """A worker re-reading a job body needs no deployment limits."""
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": USER, "max_tokens": 10**6, "n": 50})

    assert req.max_tokens == 10**6 and req.n == 50


@given(name=st.from_regex(r"[a-z_]{1,20}", fullmatch=True))
def test_any_unknown_top_level_field_is_taken_out_by_name(name: str) -> None:
    if name in ChatCompletionRequest.model_fields:
        return
    req = chat(**{name: 1})
    assert [field.path for field in take_unknown(req)] == [name]
    assert name not in json.loads(req.model_dump_json())  # so no job carries it


def test_unknown_fields_are_found_at_any_depth_with_their_paths() -> None:
    message = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": None}], "mood": 1}
    req = chat(messages=[message], response_format={"type": "text", "hint": 2}, frobnicate=True)

    found = take_unknown(req)

    assert [(field.path, field.label) for field in found] == [
        ("frobnicate", "frobnicate"),
        ("response_format.hint", "response_format.hint"),
        ("messages.0.mood", "messages.*.mood"),
        ("messages.0.content.0.cache_control", "messages.*.content.*.cache_control"),
    ]
    assert take_unknown(req) == []  # taken out: the body is clean now


@given(
    temperature=st.floats(0, 2),
    top_p=st.floats(0.01, 1),
    top_k=st.integers(-1, 100),
    max_tokens=st.integers(1, 1000),
    stop=st.one_of(st.none(), st.text(min_size=1, max_size=5), st.lists(st.text(min_size=1, max_size=5), max_size=3)),
)
def test_every_valid_request_maps_to_valid_sampling_params(temperature, top_p, top_k, max_tokens, stop) -> None:
    req = chat(temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens, stop=stop)

    params = to_sampling_params(req)

    assert params.max_tokens == max_tokens and params.top_k >= 0
    assert params.stop == ([] if stop is None else [stop] if isinstance(stop, str) else stop)
