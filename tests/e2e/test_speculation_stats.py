"""Per-request speculation stats (`include_speculation_stats`) and the draft counters by source in
`/metrics`, through the live stack (both workers run `ngram`)."""

from __future__ import annotations

import json
import time

import httpx

from tests.e2e.live_stack import SCRIPTED_MODEL, TINY_MODEL, Stack
from tests.support.scripted_model import EOS, STEPS

WAIT_S = 60.0


def _repeated_script() -> str:
    """A raw prompt that already holds the scripted turn: prompt lookup drafts it, the target accepts it."""
    turn = STEPS[2]
    return f"{EOS}{turn.marker}{turn.text}{EOS}{turn.marker}"


def _assert_consistent(spec: dict, completion_tokens: int) -> None:
    """What drafting did adds up: every forward emits one token plus the drafts it accepted (the
    last one may be cut by max_tokens or a stop), and the sources sum to the totals."""
    assert spec["mode"] == "ngram"
    assert 0 <= spec["accepted_tokens"] <= spec["draft_tokens"]
    assert spec["drafts"] <= spec["target_forwards"]
    assert spec["target_forwards"] <= completion_tokens <= spec["target_forwards"] + spec["accepted_tokens"]
    assert spec["tokens_per_forward"] == round(completion_tokens / spec["target_forwards"], 4)
    for name in ("drafts", "draft_tokens", "accepted_tokens"):
        assert sum(source[name] for source in spec["sources"].values()) == spec[name], name


def test_speculation_stats_come_in_usage_only_when_asked(stack: Stack) -> None:
    http = stack.http()
    body = {"model": SCRIPTED_MODEL, "prompt": _repeated_script(), "max_tokens": 16}
    plain = http.post("/v1/completions", json=body)
    assert plain.status_code == 200, plain.text
    assert "speculation" not in plain.json()["usage"]
    asked = http.post("/v1/completions", json=body | {"include_speculation_stats": True})
    assert asked.status_code == 200, asked.text
    usage = asked.json()["usage"]
    spec = usage["speculation"]
    _assert_consistent(spec, usage["completion_tokens"])
    assert set(spec["sources"]) == {"ngram"}
    assert spec["accepted_tokens"] >= 3, "the scripted turn is in the prompt: its first draft is accepted whole"
    assert spec["acceptance_rate"] == round(spec["accepted_tokens"] / spec["draft_tokens"], 4)


def test_openai_sdk_streams_the_stats_in_the_usage_chunk(stack: Stack) -> None:
    stream = stack.openai().chat.completions.create(
        model=TINY_MODEL,
        messages=[{"role": "user", "content": "one two three one two three one two three"}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"include_speculation_stats": True, "ignore_eos": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 24
    spec = usage.model_extra["speculation"] if usage.model_extra else None
    assert spec is not None, usage
    _assert_consistent(spec, usage.completion_tokens)


def test_metrics_split_the_draft_counters_by_source(stack: Stack) -> None:
    http = stack.http()
    assert http.post("/v1/completions", json={"model": SCRIPTED_MODEL, "prompt": _repeated_script()}).status_code == 200
    worker = _samples(httpx.get(stack.worker_metrics_urls[SCRIPTED_MODEL], timeout=WAIT_S).text)
    labels = f'model="{SCRIPTED_MODEL}",source="ngram",speculation="ngram"'
    accepted = worker[f"arbor_worker_spec_source_accepted_tokens_total{{{labels}}}"]
    assert accepted >= 3
    # one source: its counts are the totals (the worker's counters are read live)
    totals = f'model="{SCRIPTED_MODEL}",speculation="ngram"'
    assert accepted == worker[f"arbor_worker_spec_accepted_tokens_total{{{totals}}}"]
    assert (
        worker[f"arbor_worker_spec_source_draft_tokens_total{{{labels}}}"]
        == (worker[f"arbor_worker_spec_draft_tokens_total{{{totals}}}"])
    )
    deadline = time.monotonic() + WAIT_S
    while True:  # the gateway sums heartbeats: wait for a beat that carries the request
        gateway = _samples(http.get("/metrics").text)
        if gateway.get(f"arbor_spec_source_accepted_tokens_total{{{labels}}}", 0) >= accepted:
            break
        assert time.monotonic() < deadline, json.dumps({k: v for k, v in gateway.items() if "spec" in k})
        time.sleep(0.2)


def _samples(exposition: str) -> dict[str, float]:
    samples = {}
    for line in exposition.split("\n"):  # the exposition's own line break, not str.splitlines()
        if line and not line.startswith("#"):
            name, space, value = line.rpartition(" ")
            assert space, f"not a sample line: {line!r} in\n{exposition}"
            samples[name] = float(value)
    return samples
