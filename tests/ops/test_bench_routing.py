"""`bench serving --scenario`: what an arm reports from its replies' usage."""

from __future__ import annotations

from ops.bench.routing import Turn, _summary


def test_an_arm_reports_hit_rate_prefill_tokens_and_ttft_from_the_replies():
    turns = [
        Turn(ok=True, ttft_s=0.1, prompt_tokens=100, cached_tokens=0, completion_tokens=10),
        Turn(ok=True, ttft_s=0.3, prompt_tokens=200, cached_tokens=150, completion_tokens=10),
        Turn(ok=False, error="HTTP 503: no worker"),
    ]
    summary = _summary(turns, duration_s=2.0)
    assert summary["hit_rate"] == 0.5 and summary["prefill_tokens"] == 150
    assert summary["errors"] == 1 and summary["first_error"] == "HTTP 503: no worker"
    assert summary["ttft_ms"] == {"p50": 200.0, "p99": 298.0}
    assert summary["tokens_per_s"] == 10.0
