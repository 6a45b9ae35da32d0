"""The failover benchmark's arithmetic: tokens lost and duplicated, latency percentiles."""

from __future__ import annotations

from ops.bench.failover import markdown, percentiles_ms, summarize, token_errors


def test_token_errors_count_what_is_missing_and_what_is_repeated() -> None:
    reference = ["a", "b", "c", "d", "e"]
    assert token_errors(reference, reference) == (0, 0)
    assert token_errors(reference, ["a", "b", "d", "e"]) == (1, 0), "c lost"
    assert token_errors(reference, ["a", "b", "c", "c", "d", "e"]) == (0, 1), "c twice"
    assert token_errors(reference, ["a", "b", "x", "d", "e"]) == (1, 1), "c replaced"


def test_percentiles_are_nearest_rank_in_ms() -> None:
    values = percentiles_ms([i / 1000 for i in range(1, 101)])
    assert (values["p50"], values["p99"], values["max"]) == (50.0, 99.0, 100.0)
    assert percentiles_ms([]) == {}


def test_the_summary_sums_errors_per_kind_and_overall() -> None:
    rounds = [
        {
            "kind": kind,
            "write_gap_s": gap,
            "ttft_s": [0.1],
            "itl_s": [0.01, 2.0],
            "tokens_lost": lost,
            "tokens_duplicated": 0,
            "failed_streams": 0,
        }
        for kind, gap, lost in [("sigkill", 2.0, 1), ("sigstop", 3.0, 0), ("sigkill", 2.4, 0)]
    ]
    summary = summarize(rounds)
    assert summary["sigkill"]["failovers"] == 2 and summary["all"]["failovers"] == 3
    assert summary["all"]["tokens_lost"] == 1 and summary["all"]["write_gap_s"]["max"] == 3.0
    assert "| 3 | all | 2.47 / 3.00 |" in markdown(summary)
