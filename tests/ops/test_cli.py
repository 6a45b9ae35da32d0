"""The `arbor` command's edges: parsing without torch, one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time


def test_parser_builds_without_importing_torch():
    code = "import sys; from ops.cli import build_parser; build_parser(); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_model_is_one_line_error():
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "generate", "--prompt", "hi", "--model", "/no/such/model"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "/no/such/model" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_speculation_mode_is_refused():
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "generate", "--prompt", "hi", "--speculation", "magic"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "magic" in result.stderr


def test_a_setting_out_of_range_is_one_line_naming_it():
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "worker", "--publish-budget", "2", "--publish-interval-ms", "-3"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "publish_budget: Input should be less than or equal to 1" in result.stderr
    assert "publish_interval_ms: Input should be greater than or equal to 0" in result.stderr


def test_arbor_up_with_a_bad_setting_says_so_in_one_line_before_starting_anything():
    env = dict(os.environ, ARBOR_PUBLISH_BUDGET="5")
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "up", "--port", "8799"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "publish_budget:" in result.stderr, "arbor up's own error, not a child's exit during start-up"


def test_arbor_top_with_no_stack_running_says_what_to_do_in_one_line(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"} | {"XDG_RUNTIME_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "top", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "no running `arbor up` found: start one with `arbor up`" in result.stderr


def test_arbor_top_against_a_redis_that_does_not_answer_is_one_line(tmp_path):
    env = dict(os.environ, REDIS_URL=f"unix://{tmp_path}/nothing.sock")
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "top", "--once"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stderr.startswith("arbor: error: cannot read Redis") and "is the stack running?" in result.stderr


def test_an_unexpected_failure_outside_the_services_is_one_line_too(tmp_path):
    bench_output = tmp_path / "not-a-report.json"
    bench_output.write_text("[1, 2]")  # valid JSON, not a serving report: a KeyError/TypeError inside
    result = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "pool", str(bench_output)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "ARBOR_DEBUG=1 shows the traceback" in result.stderr


def test_arbor_top_reads_a_fleet_through_a_sentinel_url():
    from shared import keys
    from shared.heartbeat import Heartbeat
    from tests.support.sentinel_set import SentinelSet

    with SentinelSet() as cluster, cluster.master().client() as master:
        now = time.time()
        beat = Heartbeat(
            worker_id="w-sentinel",
            model="tiny",
            speculation="ngram",
            ready=True,
            lanes_total=4,
            lanes_busy=1,
            started_at=now,
            beat_at=now,
        )
        master.hset(keys.worker_heartbeat("w-sentinel"), mapping=beat.to_fields())
        master.sadd(keys.WORKERS_SET, "w-sentinel")
        env = dict(os.environ, REDIS_URL=cluster.url, COLUMNS="200")
        result = subprocess.run(
            [sys.executable, "-m", "ops.cli", "top", "--once"], env=env, capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 0, result.stderr
    assert "w-sentinel" in result.stdout
