"""The live stack through the official `openai` SDK: chat, streaming, completions, tools, agents, n, seeds.

Exact texts come from the scripted model (tests/support/scripted_model.py), whose greedy output is
its script; sampling, n and completions use the random tiny Qwen3.
"""

from __future__ import annotations

import json
import re

import jsonschema
import llguidance
import openai
import pytest

from shared.structured_output import StructuredOutput
from tests.e2e.live_stack import SCRIPTED_MODEL, TINY_MODEL, Stack
from tests.support.scripted_model import PLAIN, STEPS, TOOLS, ScriptedTurn
from tests.support.tiny_models import train_tokenizer

USER = {"role": "user", "content": "What is the weather in Paris?"}


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def _calls(message) -> list[tuple[str, dict]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or []]


def _declared_calls(turn: ScriptedTurn) -> list[tuple[str, dict]]:
    return [(call.name, call.arguments) for call in turn.calls]


def _stream_chat(client: openai.OpenAI, **kwargs) -> tuple[str, list[dict], str | None, list]:
    """Stream a chat completion and accumulate it as an SDK user would: content, tool calls by index."""
    content, calls, finish_reason = "", {}, None
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for fragment in delta.tool_calls or []:
                call = calls.setdefault(fragment.index, {"id": None, "name": "", "arguments": "", "num_deltas": 0})
                call["num_deltas"] += 1
                if fragment.id:
                    assert call["id"] is None, f"tool call {fragment.index} got a second id"
                    call["id"] = fragment.id
                if fragment.function is not None:
                    call["name"] += fragment.function.name or ""
                    call["arguments"] += fragment.function.arguments or ""
            if choice.finish_reason is not None:
                assert finish_reason is None, "two finish reasons for one choice"
                finish_reason = choice.finish_reason
    return content, [calls[i] for i in sorted(calls)], finish_reason, chunks


def _assistant_with_calls(content: str, calls: list[dict]) -> dict:
    functions = [{"name": c["name"], "arguments": c["arguments"]} for c in calls]
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [{"id": c["id"], "type": "function", "function": f} for c, f in zip(calls, functions)],
    }


def _tool_results(calls: list[dict], results: dict[str, str]) -> list[dict]:
    return [{"role": "tool", "tool_call_id": call["id"], "content": results[call["name"]]} for call in calls]


def _sdk_calls(message) -> list[dict]:
    return [{"id": call.id, "name": call.function.name} for call in message.tool_calls or []]


def test_chat_completion_returns_the_scripted_answer(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model=SCRIPTED_MODEL, messages=[USER])
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl")
    assert response.model == SCRIPTED_MODEL
    (choice,) = response.choices
    assert (choice.index, choice.finish_reason) == (0, "stop")
    assert (choice.message.role, choice.message.content, choice.message.tool_calls) == ("assistant", PLAIN.text, None)
    usage = response.usage
    assert usage.completion_tokens == len(PLAIN.pieces) + 1  # the pieces and the eos
    assert usage.prompt_tokens > 0 and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_a_stop_string_ends_the_text_and_is_kept_only_when_asked(client: openai.OpenAI) -> None:
    def content(**kwargs) -> str:
        return (
            client.chat.completions.create(model=SCRIPTED_MODEL, messages=[USER], stop=["scripted"], **kwargs)
            .choices[0]
            .message.content
        )

    cut = PLAIN.text.index("scripted")
    assert content() == PLAIN.text[:cut]
    assert content(extra_body={"include_stop_str_in_output": True}) == PLAIN.text[: cut + len("scripted")]


def test_min_tokens_holds_the_end_of_sequence_back(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model=SCRIPTED_MODEL, messages=[USER], max_tokens=8, extra_body={"min_tokens": 6}
    )
    (choice,) = response.choices
    assert response.usage.completion_tokens >= 6  # the script alone ends after len(PLAIN.pieces) + 1
    assert len(PLAIN.pieces) + 1 < 6 and choice.message.content.startswith(PLAIN.text)


def test_streamed_chat_yields_the_same_text_in_chunks(client: openai.OpenAI) -> None:
    content, calls, finish_reason, chunks = _stream_chat(client, model=SCRIPTED_MODEL, messages=[USER])
    assert (content, calls, finish_reason) == (PLAIN.text, [], "stop")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({chunk.id for chunk in chunks}) == 1
    # How many content chunks there are depends on timing: deltas made while the publisher is busy
    # are merged (worker/redis_side/outbox.py; tests/worker/test_outbox.py pins when). The text must add up.
    assert sum(1 for chunk in chunks for choice in chunk.choices if choice.delta.content) >= 1
    assert all(chunk.usage is None for chunk in chunks)  # not asked for


def test_stream_options_include_usage_ends_with_a_usage_chunk(client: openai.OpenAI) -> None:
    _, _, finish_reason, chunks = _stream_chat(
        client, model=SCRIPTED_MODEL, messages=[USER], stream_options={"include_usage": True}
    )
    *body, last = chunks
    assert finish_reason == "stop"
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == len(PLAIN.pieces) + 1
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert all(chunk.usage is None and chunk.choices for chunk in body)


def test_legacy_completions_stream_and_not_agree(client: openai.OpenAI) -> None:
    params = dict(model=TINY_MODEL, prompt="The quick brown fox", max_tokens=12, temperature=0)
    response = client.completions.create(**params)
    assert response.object == "text_completion" and response.model == TINY_MODEL
    (choice,) = response.choices
    assert choice.finish_reason in ("stop", "length") and choice.text
    assert response.usage.completion_tokens <= 12
    streamed = list(client.completions.create(stream=True, **params))
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == choice.text
    assert [c.choices[0].finish_reason for c in streamed if c.choices and c.choices[0].finish_reason] == [
        choice.finish_reason
    ]


def test_a_completion_of_token_ids_continues_those_tokens(client: openai.OpenAI) -> None:
    ids = client.completions.create(model=TINY_MODEL, prompt=[1, 2, 3, 4], max_tokens=6, temperature=0)
    again = client.completions.create(model=TINY_MODEL, prompt=[[1, 2, 3, 4]], max_tokens=6, temperature=0)
    assert ids.usage.prompt_tokens == 4  # the ids themselves: nothing added, nothing re-tokenized
    assert ids.usage.completion_tokens == 6 and ids.choices[0].text == again.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=TINY_MODEL, prompt=[1, -2], max_tokens=2)


def test_echo_starts_each_choice_with_its_prompt(client: openai.OpenAI) -> None:
    plain = client.completions.create(model=TINY_MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    echoed = client.completions.create(
        model=TINY_MODEL, prompt="Once upon a time", max_tokens=5, temperature=0, echo=True, n=2
    )
    assert [c.text for c in echoed.choices] == ["Once upon a time" + plain.choices[0].text] * 2
    assert echoed.usage.completion_tokens == 2 * plain.usage.completion_tokens
    chunks = list(
        client.completions.create(
            model=TINY_MODEL, prompt="Once upon a time", max_tokens=5, temperature=0, echo=True, stream=True
        )
    )
    assert chunks[0].choices[0].text.startswith("Once upon a time")
    assert "".join(c.choices[0].text for c in chunks if c.choices) == echoed.choices[0].text
    ids = client.completions.create(model=TINY_MODEL, prompt=[1, 2, 3], max_tokens=2, temperature=0, echo=True)
    alone = client.completions.create(model=TINY_MODEL, prompt=[1, 2, 3], max_tokens=2, temperature=0)
    (with_echo,), (without,) = ids.choices, alone.choices
    assert with_echo.text.endswith(without.text) and len(with_echo.text) > len(without.text)


def test_a_batch_of_prompts_answers_each_as_alone(client: openai.OpenAI) -> None:
    prompts = ["Once upon a time", "Hello", "The weather today"]
    alone = [client.completions.create(model=TINY_MODEL, prompt=p, max_tokens=5, temperature=0) for p in prompts]
    batch = client.completions.create(model=TINY_MODEL, prompt=prompts, max_tokens=5, temperature=0, n=2)
    assert [c.index for c in batch.choices] == list(range(6))
    assert [c.text for c in batch.choices] == [r.choices[0].text for r in alone for _ in range(2)]
    assert batch.usage.prompt_tokens == sum(r.usage.prompt_tokens for r in alone)
    assert batch.usage.completion_tokens == 2 * sum(r.usage.completion_tokens for r in alone)
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model=TINY_MODEL, prompt=prompts, max_tokens=5, temperature=0, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert streamed == {i: r.choices[0].text for i, r in enumerate(alone)}


def test_models_lists_every_served_model(client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {TINY_MODEL, SCRIPTED_MODEL}
    assert all(model.object == "model" for model in models.values())
    assert client.models.retrieve(SCRIPTED_MODEL).id == SCRIPTED_MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_tool_call_round_trip(client: openai.OpenAI) -> None:
    messages: list = [USER]
    first = client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == STEPS[0].content
    assert _calls(choice.message) == _declared_calls(STEPS[0])
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    # As agent code does: the SDK's own message object goes back into the conversation.
    messages += [choice.message, *_tool_results(_sdk_calls(choice.message), {"get_weather": "sunny, 18 C"})]
    second = client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
    assert second.choices[0].finish_reason == "tool_calls"
    assert _calls(second.choices[0].message) == _declared_calls(STEPS[1])
    message = second.choices[0].message
    messages += [message, *_tool_results(_sdk_calls(message), {"get_time": "12:00"})]
    answer = client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
    assert answer.choices[0].finish_reason == "stop"
    assert (answer.choices[0].message.content, answer.choices[0].message.tool_calls) == (STEPS[2].content, None)


def test_streamed_tool_call_deltas_accumulate_into_the_call(client: openai.OpenAI) -> None:
    content, calls, finish_reason, _ = _stream_chat(client, model=SCRIPTED_MODEL, messages=[USER], tools=TOOLS)
    assert (content, finish_reason) == (STEPS[0].content, "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == _declared_calls(STEPS[0])
    assert calls[0]["id"] and calls[0]["num_deltas"] >= 1  # name and arguments may arrive merged (outbox)
    messages = [USER, _assistant_with_calls(content, calls), *_tool_results(calls, {"get_weather": "sunny"})]
    content, calls, finish_reason, _ = _stream_chat(client, model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
    assert (content, finish_reason) == (STEPS[1].content, "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == _declared_calls(STEPS[1])


def test_scripted_agent_workflow_over_several_turns(client: openai.OpenAI) -> None:
    """Two questions, four tool calls (two of them parallel), two answers; streamed and not, alternately."""
    results = {"get_weather": "sunny", "get_time": "12:00"}
    messages: list = [{"role": "system", "content": "You are a travel agent."}, USER]
    for step, turn in enumerate(STEPS):
        if step % 2:
            content, calls, finish_reason, _ = _stream_chat(
                client, model=SCRIPTED_MODEL, messages=messages, tools=TOOLS
            )
            made = [(c["name"], json.loads(c["arguments"])) for c in calls]
            assistant = _assistant_with_calls(content, calls) if calls else {"role": "assistant", "content": content}
        else:
            response = client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS)
            message, finish_reason = response.choices[0].message, response.choices[0].finish_reason
            content, calls, made, assistant = message.content or "", _sdk_calls(message), _calls(message), message
        assert (content, made) == (turn.content, _declared_calls(turn)), f"step {step}"
        assert finish_reason == ("tool_calls" if turn.calls else "stop"), f"step {step}"
        messages.append(assistant)
        if calls:
            ids = [call["id"] for call in calls]
            assert len(set(ids)) == len(ids), "parallel calls need distinct ids"
            messages += _tool_results(calls, results)
        else:
            messages.append({"role": "user", "content": "And in Tokyo?"})


def test_parallel_tool_calls_false_ends_the_turn_at_its_first_call(client: openai.OpenAI) -> None:
    messages: list = [{"role": "system", "content": "You are a travel agent."}, USER]
    for _ in STEPS[:3]:  # on to the turn that makes two calls at once
        message = (
            client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS).choices[0].message
        )
        calls = _sdk_calls(message)
        messages += (
            [message, *_tool_results(calls, {"get_weather": "sunny", "get_time": "12:00"})]
            if calls
            else [message, {"role": "user", "content": "And in Tokyo?"}]
        )
    both = client.chat.completions.create(model=SCRIPTED_MODEL, messages=messages, tools=TOOLS).choices[0]
    assert _calls(both.message) == _declared_calls(STEPS[3]) and len(STEPS[3].calls) == 2

    one = client.chat.completions.create(
        model=SCRIPTED_MODEL, messages=messages, tools=TOOLS, parallel_tool_calls=False
    ).choices[0]
    assert (_calls(one.message), one.finish_reason) == (_declared_calls(STEPS[3])[:1], "tool_calls")
    assert one.message.content == STEPS[3].content.rstrip("\n")  # what followed the call is not output
    content, calls, finish_reason, _ = _stream_chat(
        client, model=SCRIPTED_MODEL, messages=messages, tools=TOOLS, parallel_tool_calls=False
    )
    assert (content, finish_reason) == (one.message.content, "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == _declared_calls(STEPS[3])[:1]


def test_seeded_sampling_is_reproducible(client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        response = client.chat.completions.create(
            model=TINY_MODEL, messages=[USER], max_tokens=16, temperature=1.0, seed=seed
        )
        return response.choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    # Sampling really happens: other seeds do not all land on the same text.
    assert {sample(seed) for seed in (1, 2, 3)} != {first}


def test_n_returns_independent_choices(client: openai.OpenAI) -> None:
    greedy = client.chat.completions.create(model=TINY_MODEL, messages=[USER], max_tokens=10, temperature=0)
    response = client.chat.completions.create(model=TINY_MODEL, messages=[USER], max_tokens=10, temperature=0, n=2)
    assert [choice.index for choice in response.choices] == [0, 1]
    assert [choice.message.content for choice in response.choices] == [greedy.choices[0].message.content] * 2
    assert response.usage.completion_tokens == 2 * greedy.usage.completion_tokens
    assert response.usage.prompt_tokens == greedy.usage.prompt_tokens

    chunks = list(
        client.chat.completions.create(
            model=TINY_MODEL, messages=[USER], max_tokens=10, temperature=1.0, seed=5, n=2, stream=True
        )
    )
    finishes = {
        choice.index: choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason
    }
    assert set(finishes) == {0, 1}


def test_logit_bias_steers_greedy_decoding(client: openai.OpenAI) -> None:
    def tokens(**kwargs) -> list[str]:
        response = client.chat.completions.create(
            model=TINY_MODEL, messages=[USER], max_tokens=8, temperature=0, logprobs=True, **kwargs
        )
        return [entry.token for entry in response.choices[0].logprobs.content]

    assert len(set(tokens())) > 1, "the unbiased greedy text repeats one token: the check below would prove nothing"
    assert len(set(tokens(logit_bias={"100": 100}))) == 1  # +100 all but forces token 100, every step
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=TINY_MODEL, messages=[USER], max_tokens=4, logit_bias={"10000000": 1})
    assert "vocabulary" in caught.value.message


def test_json_mode_answers_with_json_and_ends_when_the_object_closes(client: openai.OpenAI) -> None:
    """The random tiny model writes nothing like JSON unless made to: unbiased, its answer is JSON
    as far as it goes; with "}" pushed up, the object closes at once and the answer ends there."""
    json_mode = {"response_format": {"type": "json_object"}}
    for stream in (False, True):
        if stream:
            content, _, finish_reason, _ = _stream_chat(
                client, model=TINY_MODEL, messages=[USER], max_tokens=24, temperature=1.0, seed=3, **json_mode
            )
        else:
            response = client.chat.completions.create(
                model=TINY_MODEL, messages=[USER], max_tokens=24, temperature=1.0, seed=3, **json_mode
            )
            content, finish_reason = response.choices[0].message.content, response.choices[0].finish_reason
        assert _within(StructuredOutput("json_object", "", "response_format"), content), f"not JSON: {content!r}"
        if finish_reason == "stop":
            assert isinstance(json.loads(content), dict)

    closing = {str(train_tokenizer().token_to_id("}")): 100}
    response = client.chat.completions.create(
        model=TINY_MODEL, messages=[USER], max_tokens=24, temperature=0, logit_bias=closing, **json_mode
    )
    choice = response.choices[0]
    assert json.loads(choice.message.content) == {} and choice.finish_reason == "stop"
    assert response.usage.completion_tokens < 24


def _within(output: StructuredOutput, text: str) -> bool:
    """Whether `text` is the grammar's as far as it goes (llguidance's matcher over its tokens)."""
    tokenizer = train_tokenizer()
    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(tokenizer.to_str()), output.check(), log_level=0)
    return matcher.consume_tokens(tokenizer.encode(text, add_special_tokens=False).ids)


COLOR_SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
CITY_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
    for name in ("get_weather", "get_time")
]


@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_answer_validates_streamed_or_not(client: openai.OpenAI, stream: bool) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "c", "schema": COLOR_SCHEMA, "strict": True}}
    for seed in range(3):
        body = dict(model=TINY_MODEL, messages=[USER], max_tokens=80, temperature=1.0, seed=seed)
        if stream:
            content, _, finish_reason, _ = _stream_chat(client, response_format=response_format, **body)
        else:
            response = client.chat.completions.create(response_format=response_format, **body)
            content, finish_reason = response.choices[0].message.content, response.choices[0].finish_reason
        assert finish_reason == "stop", content
        jsonschema.validate(json.loads(content), COLOR_SCHEMA)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_a_forced_tool_call_is_made_with_arguments_valid_for_its_schema(
    client: openai.OpenAI, stream: bool, tool_choice
) -> None:
    body = dict(model=TINY_MODEL, messages=[USER], max_tokens=120, temperature=1.0, seed=4, tools=CITY_TOOLS)
    body |= {"parallel_tool_calls": False}  # one call, so the answer ends when it closes
    if stream:
        content, calls, finish_reason, _ = _stream_chat(client, tool_choice=tool_choice, **body)
    else:
        response = client.chat.completions.create(tool_choice=tool_choice, **body)
        message, finish_reason = response.choices[0].message, response.choices[0].finish_reason
        content = message.content or ""
        calls = [
            {"name": call.function.name, "arguments": call.function.arguments} for call in message.tool_calls or []
        ]
    assert finish_reason == "tool_calls" and calls, (content, calls)
    assert not content.strip(), "a forced call leaves no room for text"
    names = {"get_time"} if isinstance(tool_choice, dict) else {"get_weather", "get_time"}
    for call in calls:
        assert call["name"] in names
        jsonschema.validate(json.loads(call["arguments"]), CITY_TOOLS[0]["function"]["parameters"])


def test_forced_parallel_calls_are_each_valid(client: openai.OpenAI) -> None:
    """With parallel calls the model may go on calling until max_tokens: every call it closed is valid."""
    response = client.chat.completions.create(
        model=TINY_MODEL,
        messages=[USER],
        max_tokens=200,
        temperature=1.0,
        seed=2,
        tools=CITY_TOOLS,
        tool_choice="required",
    )
    calls, finish_reason = response.choices[0].message.tool_calls, response.choices[0].finish_reason
    assert calls and finish_reason in ("tool_calls", "length")
    closed = calls[:-1] if finish_reason == "length" else calls  # the last may be cut off by max_tokens
    assert closed, "at least one call closed"
    for call in closed:
        jsonschema.validate(json.loads(call.function.arguments), CITY_TOOLS[0]["function"]["parameters"])


def test_regex_and_choice_answers_match(client: openai.OpenAI) -> None:
    regex = client.completions.create(
        model=TINY_MODEL,
        prompt="Code:",
        max_tokens=40,
        temperature=1.0,
        seed=1,
        extra_body={"guided_regex": "[A-Z]{3}-[0-9]{3}"},
    )
    assert re.fullmatch("[A-Z]{3}-[0-9]{3}", regex.choices[0].text) and regex.choices[0].finish_reason == "stop"
    choice = client.chat.completions.create(
        model=TINY_MODEL, messages=[USER], max_tokens=20, extra_body={"guided_choice": ["sunny", "rainy"]}
    )
    assert choice.choices[0].message.content in ("sunny", "rainy")


def test_bad_schemas_and_grammars_are_400s_quoting_the_engine(client: openai.OpenAI, stack: Stack) -> None:
    bad = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "array", "uniqueItems": True}}}
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=TINY_MODEL, messages=[USER], response_format=bad)
    assert caught.value.body["param"] == "response_format.json_schema.schema"
    assert "Unimplemented keys" in caught.value.message and "uniqueItems" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=TINY_MODEL, messages=[USER], extra_body={"guided_regex": "(unclosed"})
    assert caught.value.body["param"] == "guided_regex" and "unclosed group" in caught.value.message
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=TINY_MODEL, messages=[USER], response_format={"type": "json_object"}, tools=TOOLS
        )
    assert caught.value.body["param"] == "response_format" and "tools" in caught.value.message
