"""`arbor bench agent` end to end: the real stack (embedded Redis, gateway, a worker) on a tiny random
model, two modes, two stream counts. No timings are asserted: counts, the worker's own speculation
figures and what the runs replayed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.cli import main
from tests.support.tiny_models import make_tiny_model

SMALL = ["--records", "2", "--file-chars", "200", "--call-tokens", "48", "--answer-tokens", "12"]
SMALL += ["--extract-tokens", "48", "--worker-threads", "1", "--ready-timeout", "120", "--run-timeout", "300"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    # room for a whole conversation: tool results and file contents come back into the history
    return make_tiny_model(tmp_path_factory.mktemp("agent") / "tiny-qwen3", max_position_embeddings=8192)


def test_bench_agent_replays_every_workload_in_each_mode_with_the_workers_counts(tiny_model, tmp_path):
    argv = ["bench", "agent", "--model", str(tiny_model), "--speculation", "none,ngram", "--streams", "1,3"]
    assert main([*argv, "--conversations-per-stream", "1", *SMALL, "--out", str(tmp_path)]) == 0
    assert {"agent.json", "agent.md", "gateway.log", "worker-1-ngram.log"} <= {p.name for p in tmp_path.iterdir()}
    report = json.loads((tmp_path / "agent.json").read_text())
    assert report["total_errors"] == 0
    assert [mode["mode"] for mode in report["modes"]] == ["none", "ngram"]
    turns_per_conversation = {"tools": 4, "extract": 2, "code": 4}
    for mode in report["modes"]:
        one, three = mode["runs"]
        assert (one["concurrency"], three["concurrency"]) == (1, 3)
        assert set(one["workloads"]) == {"tools"} and set(three["workloads"]) == set(turns_per_conversation)
        for run in mode["runs"]:
            assert run["conversations_done"] == run["conversations"] == run["concurrency"]
            assert run["ok"] == run["requests"] == sum(turns_per_conversation[name] for name in run["workloads"]), (
                "every turn of every conversation"
            )
            checks = run["well_formed"]
            assert checks["forced_calls_made"] == checks["forced_calls"] > 0, "a forced turn always brings its call"
            spec = run["speculation"]
            assert spec["completion_tokens"] == sum(w["completion_tokens"] for w in run["workloads"].values())
            assert spec["target_forwards"] <= spec["completion_tokens"]
            assert spec["completion_tokens"] <= spec["target_forwards"] + spec["accepted_tokens"]
            assert run["ttft_ms"]["p50"] is not None and run["itl_ms"]["p99"] >= run["itl_ms"]["p50"]
        assert three["cached_tokens"] > 0, "later turns find their conversation's history in the prefill cache"
    none, ngram = report["modes"]
    for run in none["runs"]:  # no drafter: only what a JSON schema or a forced call forces is drafted
        assert set(run["speculation"]["sources"]) == {"grammar"}
    for run in ngram["runs"]:
        spec = run["speculation"]
        assert spec["accepted_tokens"] <= spec["draft_tokens"]
        assert set(spec["sources"]) <= {"ngram", "grammar"}
        assert sum(source["draft_tokens"] for source in spec["sources"].values()) == spec["draft_tokens"]
    # greedy decoding is lossless: both modes replayed the same conversation at one stream
    assert (
        none["runs"][0]["workloads"]["tools"]["completion_tokens"]
        == (ngram["runs"][0]["workloads"]["tools"]["completion_tokens"])
    )
    assert set(report["over_none"]["ngram"]) == {"1", "3"}
    markdown = (tmp_path / "agent.md").read_text()
    assert "| ngram | 3 | 10 | 0 |" in markdown and "| none | 3 | code | 4 |" in markdown
    sources = ngram["runs"][0]["speculation"]["sources"]
    line = "- `ngram` at 1 stream(s): accepted/drafted tokens "
    assert (line in markdown) == bool(sources)
    for source, counts in sources.items():  # sources in name order
        assert f"`{source}` {counts['accepted_tokens']}/{counts['draft_tokens']}" in markdown


def test_bench_agent_refuses_an_unknown_workload_in_one_line(tmp_path, capsys):
    assert main(["bench", "agent", "--workloads", "tools,chess", "--out", str(tmp_path)]) == 2
    assert "--workloads='tools,chess'" in capsys.readouterr().err
