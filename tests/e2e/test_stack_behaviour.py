"""The live stack seen from outside the SDK: raw SSE framing, disconnects, bad input, `arbor top`, metrics."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.e2e.live_stack import REPO_ROOT, SCRIPTED_MODEL, TINY_CONTEXT, TINY_MODEL, Stack
from tests.support.scripted_model import EOS, PLAIN, STEPS

USER = {"role": "user", "content": "Tell me a long story."}
WAIT_S = 60.0  # generous: two cores shared with other jobs


@pytest.fixture(scope="module")
def http(stack: Stack) -> httpx.Client:
    return stack.http()


def _sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE body, checking that every event is one data line + a blank line."""
    body = response.read().decode()
    assert body.endswith("\n\n"), body[-200:]
    events = []
    for block in body.split("\n\n")[:-1]:
        lines = [line for line in block.split("\n") if not line.startswith(":")]  # comments: keep-alives
        if not lines:
            continue
        assert len(lines) == 1 and lines[0].startswith("data: "), block
        events.append(lines[0].removeprefix("data: "))
    return events


def _heartbeats(stack: Stack, model: str) -> list[dict]:
    client = stack.redis()
    beats = [client.hgetall(key) for key in client.scan_iter("arbor:worker:*")]
    return [beat for beat in beats if beat.get("model") == model]


def _wait_for(condition, what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _assert_error_envelope(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    if code is not None:
        assert error["code"] == code, error
    return error


def test_sse_stream_follows_the_openai_chunk_format(http: httpx.Client) -> None:
    body = {"model": SCRIPTED_MODEL, "messages": [USER], "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = _sse_events(response)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [json.loads(event) for event in events[:-1]]
    for chunk in chunks:
        assert {"id", "object", "created", "model", "choices"} <= set(chunk)
        assert chunk["object"] == "chat.completion.chunk" and chunk["model"] == SCRIPTED_MODEL
        assert isinstance(chunk["created"], int)
        for choice in chunk["choices"]:
            assert {"index", "delta", "finish_reason"} <= set(choice) and choice["index"] == 0
    assert len({chunk["id"] for chunk in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl")
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == PLAIN.text
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"][0]["finish_reason"]] == ["stop"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_client_disconnect_frees_the_workers_lane(stack: Stack, http: httpx.Client) -> None:
    tokens_before = sum(int(beat["tokens"]) for beat in _heartbeats(stack, TINY_MODEL))
    max_tokens = TINY_CONTEXT - 64
    body = {"model": TINY_MODEL, "messages": [USER], "stream": True, "max_tokens": max_tokens, "ignore_eos": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        _wait_for(
            lambda: any(int(beat["lanes_busy"]) == 1 for beat in _heartbeats(stack, TINY_MODEL)),
            "the heartbeat to show the busy lane",
        )
    # The response is closed mid-stream: the gateway must cancel, the worker must drop the lane.
    _wait_for(
        lambda: all(int(beat["lanes_busy"]) == 0 for beat in _heartbeats(stack, TINY_MODEL)), "the lane to be freed"
    )
    generated = sum(int(beat["tokens"]) for beat in _heartbeats(stack, TINY_MODEL)) - tokens_before
    assert generated < max_tokens, f"the worker generated all {generated} tokens: the cancel never reached it"
    health = http.get("/health").json()
    assert all(worker["lanes_busy"] == 0 for worker in health["workers"])


def _chat(**overrides) -> dict:
    return {"model": TINY_MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4} | overrides


BAD_BODIES = {
    "wrong type: messages": (_chat(messages="hi"), 400, None),
    "wrong type: max_tokens": (_chat(max_tokens="ten"), 400, None),
    "wrong type: temperature": (_chat(temperature=[1]), 400, None),
    "negative max_tokens": (_chat(max_tokens=-5), 400, None),
    "huge max_tokens": (_chat(max_tokens=10**12), 400, None),
    "max_tokens over the context": (_chat(max_tokens=TINY_CONTEXT + 10), 400, "context_length_exceeded"),
    "unknown field": (_chat(frobnicate=True), 400, None),
    "logit_bias keyed by a word": (_chat(logit_bias={"hello": 1}), 400, None),
    "logit_bias outside the vocabulary": (_chat(logit_bias={"10000000": 1}), 400, "invalid_request"),
    "unknown model": (_chat(model="no-such-model"), 404, None),
    "prompt longer than the context": (
        _chat(messages=[{"role": "user", "content": "apples pears plums " * TINY_CONTEXT}]),
        400,
        "context_length_exceeded",
    ),
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_request_gets_an_error_envelope(http: httpx.Client, case: str) -> None:
    body, status, code = BAD_BODIES[case]
    _assert_error_envelope(http.post("/v1/chat/completions", json=body), status, code)


def test_bad_bytes_get_an_error_envelope_and_the_stack_stays_healthy(stack: Stack, http: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    _assert_error_envelope(http.post("/v1/chat/completions", content=b'{"model": "tiny', headers=headers), 400)
    _assert_error_envelope(http.post("/v1/completions", content=b"\xff\xfe not json", headers=headers), 400)
    oversized = json.dumps(_chat(messages=[{"role": "user", "content": "x" * (5 * 2**20)}])).encode()
    _assert_error_envelope(http.post("/v1/chat/completions", content=oversized, headers=headers), 413)
    with pytest.raises(openai.NotFoundError):
        stack.openai().chat.completions.create(**_chat(model="no-such-model"))
    assert http.get("/health").status_code == 200
    answer = stack.openai().chat.completions.create(**_chat(model=SCRIPTED_MODEL))
    assert answer.choices[0].message.content == PLAIN.text


def test_arbor_top_once_shows_each_worker_and_its_mode(stack: Stack) -> None:
    env = dict(os.environ, COLUMNS="200")
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "top", "--once", "--redis-url", stack.redis_url],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert result.returncode == 0, result.stderr
    rows = [[cell.strip() for cell in line.split("│")] for line in result.stdout.splitlines() if "│" in line]
    for model in (TINY_MODEL, SCRIPTED_MODEL):
        (beat,) = _heartbeats(stack, model)
        (row,) = [row for row in rows if beat["worker_id"] in row]
        assert {model, "ngram", "yes"} <= set(row), row


def _complete_a_repeated_script(stack: Stack) -> None:
    """A raw prompt that already holds the scripted turn: prompt lookup drafts it, the target accepts it."""
    turn = STEPS[2]
    prompt = f"{EOS}{turn.marker}{turn.text}{EOS}{turn.marker}"
    response = stack.openai().completions.create(model=SCRIPTED_MODEL, prompt=prompt, max_tokens=16)
    assert (response.choices[0].text, response.choices[0].finish_reason) == (turn.text, "stop")


def test_ngram_speculation_accepts_drafts_found_in_the_prompt(stack: Stack) -> None:
    def accepted() -> int:
        return sum(int(beat["accepted_tokens"]) for beat in _heartbeats(stack, SCRIPTED_MODEL))

    before = accepted()
    _complete_a_repeated_script(stack)
    # The continuation (3 pieces + eos) is in the prompt; at least the first draft is accepted whole.
    _wait_for(lambda: accepted() - before >= 3, "the heartbeat to count the accepted draft tokens")


def _metric_names(exposition: str) -> set[str]:
    samples = (line.split("{")[0].split(" ")[0] for line in exposition.splitlines() if line and line[0] != "#")
    return {re.sub(r"_(bucket|sum|count)$", "", name) for name in samples}


def test_every_dashboard_metric_is_exported_live(stack: Stack, http: httpx.Client) -> None:
    dashboard = json.loads((REPO_ROOT / "ops/deploy/grafana/dashboards/arbor.json").read_text())
    exprs = []

    def collect(node) -> None:
        if isinstance(node, dict):
            exprs.extend(value for key, value in node.items() if key == "expr" and isinstance(value, str))
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(dashboard)
    wanted = {re.sub(r"_(bucket|sum|count)$", "", name) for expr in exprs for name in re.findall(r"\barbor_\w+", expr)}
    assert len(wanted) >= 10, exprs
    # Give every series a sample: a finished request with accepted drafts (latency histograms,
    # acceptance by position) and a rejection.
    _complete_a_repeated_script(stack)
    http.post("/v1/chat/completions", json=_chat(model="no-such-model"))
    exported = _metric_names(http.get("/metrics").text)
    for url in stack.worker_metrics_urls.values():
        exported |= _metric_names(httpx.get(url, timeout=WAIT_S).text)
    assert sorted(wanted - exported) == []
