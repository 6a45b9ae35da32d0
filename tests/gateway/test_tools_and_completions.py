"""A tool-call round trip and legacy completions, through the OpenAI SDK."""

from __future__ import annotations

import json
import time

import openai
import pytest
import redis

from shared import keys
from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, WaitForCancel, delta, error, final

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _weather_script(job: Job) -> list[Step]:
    """Call the tool on a user turn; answer from the tool's result on a tool turn."""
    last = job.request()["messages"][-1]
    if last["role"] == "tool":
        return [delta(f"It is {json.loads(last['content'])['temp_c']} C in Paris."), final()]
    call = {
        "index": 0,
        "id": "call_7",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    return [
        delta(tool_calls=[call]),
        delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]),
        final("tool_calls"),
    ]


def test_tool_call_round_trip(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_weather_script)
    client = gateway.openai()
    messages: list[dict] = [{"role": "user", "content": "Weather in Paris?"}]

    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="auto")
    [call] = first.choices[0].message.tool_calls
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})})
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER_TOOL])

    assert first.choices[0].finish_reason == "tool_calls"
    assert first.choices[0].message.content is None
    assert (call.id, call.type, call.function.name) == ("call_7", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert second.choices[0].message.content == "It is 21 C in Paris."
    sent = json.loads(peer.jobs[1].body)
    assert sent["tools"] == [WEATHER_TOOL]
    assert sent["messages"][1]["tool_calls"][0]["id"] == "call_7"
    assert sent["messages"][2] == {"role": "tool", "tool_call_id": "call_7", "content": '{"temp_c": 21}'}


def test_streamed_tool_call_reassembles_in_the_sdk(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_weather_script)
    stream = gateway.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_TOOL], stream=True
    )

    parts = [tc for chunk in stream if chunk.choices for tc in chunk.choices[0].delta.tool_calls or []]

    assert parts[0].id == "call_7" and parts[0].function.name == "get_weather"
    assert "".join(p.function.arguments or "" for p in parts) == '{"city": "Paris"}'


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_choice_reaches_the_worker_as_a_constraint(
    gateway: GatewayServer, peer: ProtocolPeer, tool_choice
) -> None:
    gateway.openai().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], tools=[WEATHER_TOOL], tool_choice=tool_choice
    )
    [job] = peer.jobs
    assert json.loads(job.body)["tool_choice"] == tool_choice


def test_a_forced_call_of_a_function_not_in_tools_is_refused_by_name(
    gateway: GatewayServer, peer: ProtocolPeer
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.openai().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "f"}},
        )
    assert caught.value.body["param"] == "tool_choice" and "'f'" in caught.value.message
    assert peer.jobs == []


def test_completion_non_streaming(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    reply = gateway.openai().completions.create(model=MODEL, prompt="Once upon", max_tokens=5)

    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].text == "Hello, world"
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    [job] = peer.jobs
    assert job.kind == "completion"
    assert json.loads(job.body)["prompt"] == "Once upon"


def test_completion_stream_with_usage(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    chunks = list(
        gateway.openai().completions.create(
            model=MODEL, prompt=["Once"], stream=True, stream_options={"include_usage": True}
        )
    )

    assert "".join(c.choices[0].text for c in chunks if c.choices) == "Hello, world"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 10


def _logprob_script(job: Job) -> list[Step]:
    entries = [
        {"token": "Hel", "logprob": -0.1, "top_logprobs": [{"token": "Hel", "logprob": -0.1}]},
        {"token": "lo", "logprob": -0.2, "top_logprobs": [{"token": "lo", "logprob": -0.2}]},
    ]
    return [delta("Hello", token_ids=[1, 2], logprobs=entries), final()]


def test_completion_logprobs_use_the_legacy_shape(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_logprob_script)

    reply = gateway.openai().completions.create(model=MODEL, prompt="x", logprobs=1)

    logprobs = reply.choices[0].logprobs
    assert logprobs.tokens == ["Hel", "lo"]
    assert logprobs.token_logprobs == [-0.1, -0.2]
    assert logprobs.top_logprobs == [{"Hel": -0.1}, {"lo": -0.2}]
    assert logprobs.text_offset == [0, 3]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),  # 0 only with echo or prompt_logprobs
        ({"prompt_logprobs": 21}, "prompt_logprobs"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 2}, "best_of"),
        ({"prompt": ["a"] * 65}, "prompt"),  # over ARBOR_MAX_PROMPTS (64)
        ({"prompt": [[1, 2], []]}, "prompt"),
    ],
)
def test_unsupported_completion_options_are_refused(
    gateway: GatewayServer, peer: ProtocolPeer, extra: dict, param: str
) -> None:
    response = gateway.http().post("/v1/completions", json={"model": MODEL, "prompt": "x"} | extra)

    assert response.status_code == 400
    assert response.json()["error"]["param"] == param
    assert peer.jobs == []


def _echo_script(job: Job) -> list[Step]:
    """Each choice says which prompt and choice it is; the prompt's length is its token count."""
    request = job.request()
    prompt = request["prompt"]  # one text, or one list of token ids
    name = prompt if isinstance(prompt, str) else str(prompt[0])
    steps: list[Step] = []
    for choice in range(request.get("n", 1)):
        steps += [
            delta(f"{name}/{choice}", choice=choice, token_ids=[1]),
            final(choice=choice, prompt_tokens=len(prompt), completion_tokens=1),
        ]
    return steps


def test_a_batch_of_prompts_is_one_job_each_and_one_reply(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_echo_script)
    prompts = ["a", "bb", "ccc"]

    reply = gateway.openai().completions.create(model=MODEL, prompt=prompts, n=2, max_tokens=3)

    # OpenAI's numbering: prompt by prompt, n choices each.
    assert [(c.index, c.text) for c in reply.choices] == [
        (0, "a/0"),
        (1, "a/1"),
        (2, "bb/0"),
        (3, "bb/1"),
        (4, "ccc/0"),
        (5, "ccc/1"),
    ]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (1 + 2 + 3, 6)
    assert sorted(json.loads(job.body)["prompt"] for job in peer.jobs) == prompts
    assert peer.problems == []


def test_a_streamed_batch_renumbers_every_chunk_and_ends_once(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_echo_script)

    chunks = list(
        gateway.openai().completions.create(
            model=MODEL, prompt=[[5, 6], [7]], n=2, max_tokens=3, stream=True, stream_options={"include_usage": True}
        )
    )

    texts: dict[int, str] = {}
    finishes = {}
    for chunk in chunks[:-1]:
        (choice,) = chunk.choices
        texts[choice.index] = texts.get(choice.index, "") + choice.text
        if choice.finish_reason:
            finishes[choice.index] = choice.finish_reason
    assert texts == {0: "5/0", 1: "5/1", 2: "7/0", 3: "7/1"}  # the stand-in worker writes the first id
    assert finishes == dict.fromkeys(range(4), "stop")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert len({chunk.id for chunk in chunks}) == 1


def _one_fails_script(job: Job) -> list[Step]:
    if job.request()["prompt"] == "bad":
        return [error("the model broke")]
    return [delta("slow", token_ids=[1]), WaitForCancel()]


def test_a_failing_prompt_fails_the_batch_and_cancels_the_others(gateway: GatewayServer, make_peer) -> None:
    peer = make_peer(script=_one_fails_script)

    response = gateway.http().post("/v1/completions", json={"model": MODEL, "prompt": ["ok", "bad", "ok too"]})

    assert response.status_code == 500 and response.json()["error"]["code"] == "internal_error"

    def others() -> list[str]:  # the stand-in worker may read a job only after the batch failed
        return sorted(job.id for job in peer.jobs if job.request()["prompt"] != "bad")

    deadline = time.monotonic() + 10
    while (len(others()) < 2 or sorted(peer.cancelled) != others()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(others()) == 2 and sorted(peer.cancelled) == others()


def test_a_batch_the_queue_cannot_take_whole_is_429_and_leaves_no_job(
    make_gateway, redis_client: redis.Redis, make_peer
) -> None:
    gateway = make_gateway(max_queue=2)
    make_peer(consume=False)

    response = gateway.http().post("/v1/completions", json={"model": MODEL, "prompt": ["a", "b", "c"]})

    assert response.status_code == 429
    entries = redis_client.xrange(keys.request_stream(MODEL))
    assert len(entries) == 2, "two of the prompts were queued before the third was refused"
    queued = [Job.from_fields(fields).id for _, fields in entries]
    assert sorted(key.split(":")[-1] for key in redis_client.keys(keys.cancel_key("*"))) == sorted(queued)
