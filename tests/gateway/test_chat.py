"""Chat completions through the official OpenAI SDK, against the real gateway and Redis."""

from __future__ import annotations

import json

from shared.protocol import Job
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer, Step, delta, final, lost

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]


def test_chat_non_streaming_returns_content_and_usage(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    reply = gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=16)

    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    assert reply.model == MODEL
    assert [c.message.content for c in reply.choices] == ["Hello, world"]
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "stop"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens, reply.usage.total_tokens) == (7, 3, 10)


def test_chat_job_carries_the_validated_request(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    gateway.openai().chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0.5, stop=["\n"], extra_body={"top_k": 20}
    )

    [job] = peer.jobs
    body = json.loads(job.body)
    assert job.kind == "chat" and job.model == MODEL and job.attempt == 1
    assert body["messages"] == MESSAGES
    assert (body["temperature"], body["stop"], body["top_k"]) == (0.5, ["\n"], 20)
    assert body["max_tokens"] == gateway.settings.default_max_tokens  # resolved by the gateway
    assert job.deadline - job.created == gateway.settings.request_timeout_s


def test_chat_stream_yields_role_then_deltas_then_finish(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    chunks = list(gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))

    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == "Hello, world"
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "stop"]
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert all(c.usage is None for c in chunks)


def test_chat_stream_include_usage_ends_with_a_usage_chunk(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    stream = gateway.openai().chat.completions.create(
        model=MODEL, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)

    *body, last = chunks
    assert last.choices == []
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (7, 3, 10)
    assert all(c.usage is None for c in body)


def _gap_script(job: Job) -> list[Step]:
    return [
        delta("one ", token_ids=[1]),
        lost(delta("two ", token_ids=[2])),  # not published, but in the event log
        delta("three", token_ids=[3]),
        lost(final(completion_tokens=3)),  # lost too: found by the quiet-time poll
    ]


def test_chat_stream_repairs_seq_gaps_from_the_event_log(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_gap_script)

    chunks = list(gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))

    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "one two three"
    assert chunks[-1].choices[0].finish_reason == "stop"


def _reasoning_script(job: Job) -> list[Step]:
    return [
        delta(reasoning="The user wants ", token_ids=[1]),
        delta(reasoning="a greeting.", token_ids=[2]),
        delta(token_ids=[3]),  # the close tag: no text for the client
        delta("Hi!", token_ids=[4]),
        final(completion_tokens=4),
    ]


def test_reasoning_streams_as_reasoning_content(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_reasoning_script)
    client = gateway.openai()

    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True))
    reply = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, extra_body={"chat_template_kwargs": {"enable_thinking": True}}
    )

    reasoning = "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or "" for c in chunks)
    assert reasoning == "The user wants a greeting."
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hi!"
    assert len(chunks) == 1 + 3 + 1  # role, two reasoning deltas, one content delta, finish: the empty one skipped
    assert reply.choices[0].message.content == "Hi!"
    assert reply.choices[0].message.model_extra["reasoning_content"] == "The user wants a greeting."


def _two_choices(job: Job) -> list[Step]:
    return [
        delta("A", choice=0),
        delta("B", choice=1),
        final("stop", choice=1, completion_tokens=1),
        delta("A", choice=0),
        final("length", choice=0, completion_tokens=2),
    ]


def test_n_choices_are_kept_apart_and_usage_sums_completions(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_two_choices)
    client = gateway.openai()

    reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, stream=True))

    assert [(c.message.content, c.finish_reason) for c in reply.choices] == [("AA", "length"), ("B", "stop")]
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 3)
    roles = [c.choices[0].index for c in chunks if c.choices[0].delta.role == "assistant"]
    assert roles == [0, 1]
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "stop"}


def _logprob_script(job: Job) -> list[Step]:
    entry = {
        "token": "Hi",
        "logprob": -0.5,
        "bytes": [72, 105],
        "top_logprobs": [{"token": "Hi", "logprob": -0.5}],
    }
    return [delta("Hi", token_ids=[9], logprobs=[entry]), final(completion_tokens=1)]


def test_chat_logprobs_follow_the_openai_shape(gateway: GatewayServer, make_peer) -> None:
    make_peer(script=_logprob_script)

    reply = gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, logprobs=True, top_logprobs=1)

    [entry] = reply.choices[0].logprobs.content
    assert (entry.token, entry.logprob, entry.bytes) == ("Hi", -0.5, [72, 105])
    assert entry.top_logprobs[0].token == "Hi"
