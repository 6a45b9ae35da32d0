"""`arbor bench` end to end on a tiny random model: files written, ratios computed, losslessness
checked, a real stack served without errors. No timings are asserted: they belong in the reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.bench.client import RequestRecord, latency_ms
from ops.bench.pairs import QUIET_CORES
from ops.bench.results import percentile
from ops.bench.serving import comparison_summary
from ops.cli import main
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("bench") / "tiny-qwen3")


def bench_report(argv: list[str], out: Path, name: str) -> dict:
    """Runs `arbor <argv> --out <out>` with one torch thread; its `<name>.json`."""
    with one_torch_thread():
        assert main([*argv, "--out", str(out)]) == 0
    return json.loads((out / f"{name}.json").read_text())


def test_the_paired_ratio_compares_neighbours_and_ignores_failed_pairs():
    def record(ttft_s: float, e2e_s: float, tokens: int = 11, ok: bool = True) -> RequestRecord:
        return RequestRecord(ok=ok, ttft_s=ttft_s, e2e_s=e2e_s, completion_tokens=tokens)

    # Pair by pair the gateway is 0.9x (10 tokens after the first in 1.0 s vs 0.9 s) while the
    # machine slows 3x halfway: pooled rates would mix the two halves, the pairs do not.
    gateway = [record(0.1, 1.1)] * 5 + [record(0.3, 3.3)] * 5 + [record(0.1, 0.5, ok=False)]
    local = [record(0.05, 0.95)] * 5 + [record(0.15, 2.85)] * 5 + [record(0.05, 0.95)]
    paired = comparison_summary(gateway, local)["paired_decode_ratio"]
    assert paired["pairs"] == 10
    assert paired["median"] == pytest.approx(0.9) and paired["ci95"] == pytest.approx([0.9, 0.9])
    assert comparison_summary([record(0.1, 0.5, ok=False)], [record(0.1, 0.5)])["paired_decode_ratio"] is None
    # Over end-to-end time (TTFT included) each pair is 0.95/1.1 and 2.85/3.3: 0.8636 either way.
    end_to_end = comparison_summary(gateway, local)["paired_ratio"]
    assert end_to_end["pairs"] == 10 and end_to_end["median"] == pytest.approx(0.8636, abs=1e-4)


def test_the_comparison_splits_off_the_pairs_during_which_other_processes_were_quiet():
    def record(e2e_s: float) -> RequestRecord:
        return RequestRecord(ok=True, ttft_s=0.1, e2e_s=e2e_s, completion_tokens=11)

    # Quiet pairs run the gateway at 0.98x; while others take a core it falls to 0.9x.
    gateway = [record(1.0), record(1.0), record(1.0), record(1.0)]
    local = [record(0.98), record(0.9), record(0.98), record(0.9)]
    other_cores = [0.0, 1.0, QUIET_CORES / 2, None]  # None: not measured, so not known to be quiet
    load = comparison_summary(gateway, local, other_cores)["other_load"]
    assert load["paired_ratio_quiet"]["pairs"] == 2 and load["paired_ratio_quiet"]["median"] == pytest.approx(0.98)
    assert load["cores_p50"] == pytest.approx(QUIET_CORES / 2) and load["cores_p90"] == pytest.approx(0.825)
    assert comparison_summary(gateway, local, other_cores)["paired_ratio"]["median"] == pytest.approx(0.94)
    assert comparison_summary(gateway, local, other_cores)["pairs"][1] == {
        "gateway_e2e_s": 1.0,
        "gateway_tpot_s": 0.09,
        "local_e2e_s": 0.9,
        "local_tpot_s": 0.08,
        "other_cores": 1.0,
    }
    unmeasured = comparison_summary(gateway, local, [None] * 4)["other_load"]
    assert unmeasured["paired_ratio_quiet"] is None and unmeasured["cores_p50"] is None


def test_percentile_interpolates_between_closest_ranks():
    assert percentile([40, 10, 30, 20], 50) == 25.0
    assert percentile([10, 20, 30, 40], 99) == pytest.approx(39.7)
    assert percentile([7.0], 99) == 7.0 and percentile([], 50) is None
    assert latency_ms([0.010, 0.020]) == {"p50": 15.0, "p99": 19.9, "n": 2}


def test_bench_decode_writes_reports_with_ratios_and_a_passing_lossless_check(tiny_model, tmp_path, capsys):
    argv = [
        "bench",
        "decode",
        "--model",
        str(tiny_model),
        "--modes",
        "none,ngram",
        "--prompts",
        "2",
        "--max-tokens",
        "8",
        "--out",
        str(tmp_path),
    ]
    with one_torch_thread():
        assert main(argv) == 0
    assert {"decode.json", "decode.md", "decode.png"} <= {path.name for path in tmp_path.iterdir()}
    assert (tmp_path / "decode.png").read_bytes().startswith(b"\x89PNG")
    report = json.loads((tmp_path / "decode.json").read_text())
    contenders = {c["name"]: c for c in report["contenders"]}
    assert {"arbor none", "arbor ngram", "transformers generate"} <= set(contenders)
    assert report["baseline"] == "arbor none" and contenders["arbor none"]["ratio_to_baseline"] == 1.0
    for contender in contenders.values():
        assert contender["tokens"] == 2 * 8
        assert contender["ratio_to_baseline"] > 0 and contender["wall_ratio_to_baseline"] > 0
    assert contenders["arbor none"]["tokens_per_forward"] == 1.0
    assert report["lossless"]["compared"] and report["lossless"]["identical"] is True
    assert report["lossless"]["modes"] == ["none", "ngram"]
    assert report["transformers_agreement"]["num_prompts"] == 2
    assert any(item["name"] == "transformers assistant" for item in report["unavailable"])
    markdown = (tmp_path / "decode.md").read_text()
    assert "| arbor ngram |" in markdown and "token ids identical to `none` for ngram" in markdown
    assert "| arbor ngram |" in capsys.readouterr().out


def test_bench_decode_in_json_mode_checks_the_answers_and_times_the_mask_beside_plain_text(tiny_model, tmp_path):
    report = bench_report(
        [
            "bench",
            "decode",
            "--model",
            str(tiny_model),
            "--modes",
            "none,ngram",
            "--prompts",
            "2",
            "--max-tokens",
            "16",
            "--json-mode",
        ],
        tmp_path,
        "decode",
    )
    contenders = {c["name"]: c for c in report["contenders"]}
    assert set(contenders) == {"arbor none", "arbor ngram", "arbor none, text"}
    assert contenders["arbor none, text"]["tokens"] == 2 * 16  # EOS ignored: the whole budget
    assert report["lossless"]["identical"] is True and report["lossless"]["modes"] == ["none", "ngram"]
    check = report["constraint_check"]
    assert check["within_grammar"] == 2 and check["mask_us_p50"] > 0 and check["first_request_compile_ms"] > 0
    assert "transformers" in {item["name"] for item in report["unavailable"]}
    assert "**Constrained** by `json_object`" in (tmp_path / "decode.md").read_text()


def test_bench_decode_reports_a_missing_drafter_as_unavailable(tiny_model, tmp_path):
    report = bench_report(
        [
            "bench",
            "decode",
            "--model",
            str(tiny_model),
            "--modes",
            "none,dflash",
            "--prompts",
            "1",
            "--max-tokens",
            "2",
            "--no-transformers",
        ],
        tmp_path,
        "decode",
    )
    (missing,) = report["unavailable"]
    assert missing["name"] == "arbor dflash" and "--draft" in missing["reason"] and "\n" not in missing["reason"]
    assert [c["name"] for c in report["contenders"]] == ["arbor none"]


def test_bench_serving_small_run_has_no_errors_and_reports_percentiles_per_mode(tiny_model, tmp_path):
    argv = [
        "bench",
        "serving",
        "--model",
        str(tiny_model),
        "--speculation",
        "none,ngram",
        "--workers",
        "1",
        "--concurrency",
        "1,2",
        "--requests-per-level",
        "2",
        "--max-tokens",
        "8",
        "--compare-requests",
        "1",
        "--worker-threads",
        "1",
        "--ready-timeout",
        "120",
        "--level-timeout",
        "60",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    assert {"serving.json", "serving.md", "serving.png", "gateway.log", "worker-1.log", "worker-1-ngram.log"} <= {
        path.name for path in tmp_path.iterdir()
    }, "the workers restarted in ngram log beside the first ones"
    report = json.loads((tmp_path / "serving.json").read_text())
    assert report["total_errors"] == 0
    assert [run["mode"] for run in report["modes"]] == ["none", "ngram"]
    for run in report["modes"]:
        assert [level["concurrency"] for level in run["sweep"]] == [1, 2]
        for level in run["sweep"]:
            assert level["ok"] == 2 and level["errors"] == 0
            assert level["output_tokens_per_s"] > 0 and level["requests_per_s"] > 0
            for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
                assert level[key]["p50"] is not None and level[key]["p99"] >= level[key]["p50"]
    assert report["modes"][0]["goals"]["tokens_per_s_over_none"] is None
    assert set(report["modes"][1]["goals"]["tokens_per_s_over_none"]) == {"1", "2"}
    comparison = report["comparison"]
    assert comparison["gateway"]["ok"] == comparison["in_process"]["ok"] == 1
    assert comparison["tokens_per_s_ratio"] > 0 and comparison["added_ttft_p50_ms"] is not None
    for key in ("paired_ratio", "paired_decode_ratio"):
        paired = comparison[key]
        assert paired["pairs"] == 1 and paired["ci95"][0] <= paired["median"] <= paired["ci95"][1]
    assert "Over end-to-end time, request by request" in (tmp_path / "serving.md").read_text()
    assert comparison["other_load"]["cores_p50"] is not None  # Linux: /proc is there
    assert "Other processes on the machine took" in (tmp_path / "serving.md").read_text()
    assert report["scaling"] == []  # one worker count: nothing to scale against
    assert "| 2 | 2 | 0 |" in (tmp_path / "serving.md").read_text()


def test_bench_serving_sends_the_same_load_through_each_api_and_reads_every_stream(tiny_model, tmp_path):
    argv = ["bench", "serving", "--model", str(tiny_model), "--workers", "1", "--concurrency", "1,2"]
    argv += ["--requests-per-level", "2", "--max-tokens", "6", "--compare-requests", "0", "--worker-threads", "1"]
    argv += ["--api", "chat,messages,responses", "--ready-timeout", "120", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "serving.json").read_text())
    assert report["total_errors"] == 0
    assert set(report["apis"]) == {"chat", "messages", "responses"}
    for api, levels in report["apis"].items():
        assert [level["concurrency"] for level in levels] == [1, 2], api
        for level in levels:  # every stream read to its end, its usage and its text seen
            assert level["ok"] == 2 and level["output_tokens_per_s"] > 0, (api, level)
            assert level["ttft_ms"]["p50"] is not None, api
    assert "| messages | 2 | 0 |" in (tmp_path / "serving.md").read_text()


def test_bench_serving_refuses_an_unknown_api_in_one_line(tiny_model, tmp_path, capsys):
    assert main(["bench", "serving", "--model", str(tiny_model), "--api", "chat,grpc", "--out", str(tmp_path)]) == 2
    assert "--api='chat,grpc'" in capsys.readouterr().err


def test_bench_owner_runs_both_loops_through_a_real_redis(tiny_model, tmp_path, capsys):
    report = bench_report(
        ["bench", "owner", "--model", str(tiny_model), "--requests", "3", "--max-tokens", "8", "--threads", "1"],
        tmp_path,
        "owner",
    )
    assert (tmp_path / "owner.md").read_text() in capsys.readouterr().out
    assert set(report["contenders"]) == {"generate", "owner"}
    for row in report["contenders"].values():
        assert row["requests"] == 3
        assert 0 < row["model_us_per_token"] <= row["wall_us_per_token"] and row["cpu_us_per_token"] > 0
    paired = report["paired_ratio"]
    assert paired["pairs"] == 3 and paired["ci95"][0] <= paired["median"] <= paired["ci95"][1]


def test_bench_owner_with_a_free_model_times_the_loops_alone(tiny_model, tmp_path):
    report = bench_report(
        [
            "bench",
            "owner",
            "--model",
            str(tiny_model),
            "--requests",
            "2",
            "--max-tokens",
            "64",
            "--threads",
            "1",
            "--free-model",
        ],
        tmp_path,
        "owner",
    )
    assert report["settings"]["free_model"] and "Free model" in (tmp_path / "owner.md").read_text()
    assert all(row["cpu_us_per_token"] > 0 for row in report["contenders"].values())


def test_the_free_model_emits_the_prompt_again_until_max_tokens_then_gives_the_runner_back(tiny_model):
    from ops.bench.owner import _FreeModel
    from shared.sampling import SamplingParams
    from worker.serving_model import load_serving_model

    with one_torch_thread():
        runner = load_serving_model(str(tiny_model), "none").runner
        real = runner.decode_step
        with _FreeModel(runner, enabled=True):
            sequence = runner.start("free", [5, 6, 7], SamplingParams(max_tokens=5, ignore_eos=True))
            runner.prefill(sequence, 64)
            while not sequence.finished:
                runner.decode_step(sequence)
                assert sequence.num_to_prefill == 0, "the cache advances with every emitted token"
        assert sequence.output_ids == [5, 6, 7, 5, 6] and sequence.finish_reason == "length"
        assert runner.decode_step == real
        assert sequence.stats.decode_s == 0.0


@pytest.mark.parametrize(
    "argv",
    [
        ["--requests", "0"],
        ["--max-tokens", "1"],
        ["--publish-interval-ms", "-1"],
        ["--publish-budget", "-1"],
        ["--max-tokens", "100000"],
    ],
)
def test_bench_owner_refuses_bad_settings_in_one_line(tiny_model, argv, capsys):
    assert main(["bench", "owner", "--model", str(tiny_model), *argv]) != 0
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and (argv[0] in error or "max_tokens=100000" in error)
    assert error.count("must be") <= 1, "only what is wrong is named"


def test_bench_pool_pools_the_pairs_of_several_runs_and_names_a_report_without_them(tmp_path, capsys):
    def pair(gateway_s: float | None, local_s: float, other_cores: float | None) -> dict:
        return {
            "gateway_e2e_s": gateway_s,
            "gateway_tpot_s": gateway_s and gateway_s / 100,
            "local_e2e_s": local_s,
            "local_tpot_s": local_s / 100,
            "other_cores": other_cores,
        }

    # Run a: three quiet pairs at 0.98. Run b: two pairs at 0.9 while others took a core, one
    # failed pair (no gateway time). Pooled: 0.98, 0.98, 0.98, 0.9, 0.9 -> median 0.98.
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "serving.json").write_text(json.dumps({"comparison": {"pairs": [pair(1.0, 0.98, 0.0)] * 3}}))
    (tmp_path / "b.json").write_text(
        json.dumps({"comparison": {"pairs": [pair(1.0, 0.9, 1.0), pair(1.0, 0.9, None), pair(None, 0.9, 0.0)]}})
    )
    assert main(["bench", "pool", str(tmp_path / "a"), str(tmp_path / "b.json")]) == 0
    table = capsys.readouterr().out
    # Tokens/s, all tokens over all time: (3 × 0.98 + 2 × 0.9) / 5 s of gateway time (the failed pair left out).
    assert "| **pooled, 2 runs** | 6 | 0.948 | 0.980 (0.900-0.980) | 0.980 (0.900-0.980) |" in table
    assert f"| pooled, quiet pairs (others < {QUIET_CORES:g} core) | 4 | 0.980 | 0.980 (0.980-0.980) |" in table
    assert "| " + str(tmp_path / "b.json") + " | 3 | 0.900 | 0.900 (0.900-0.900) |" in table

    (tmp_path / "old.json").write_text(json.dumps({"comparison": {"paired_ratio": {}}}))
    assert main(["bench", "pool", str(tmp_path / "old.json")]) == 2
    assert "no gateway/in-process pairs" in capsys.readouterr().err


def test_bench_numerics_compares_formats_with_float32_by_agreement_and_kl(tiny_model, tmp_path, capsys):
    argv = ["bench", "numerics", "--model", str(tiny_model), "--formats", "float32,int4"]
    assert main([*argv, "--prompts", "2", "--max-tokens", "6", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "numerics.json").read_text())
    same, int4 = report["formats"]["float32"], report["formats"]["int4"]
    assert same["identical_prompts"] == 2 and same["kl_mean"] == 0.0  # float32 against itself
    assert int4["num_prompts"] == 2 and int4["kl_mean"] > 0 and int4["kl_p99"] >= 0
    assert "| int4 |" in capsys.readouterr().out
