"""Deployment files are valid for the tools that read them.

`.ci/run` installs Debian's docker-compose and prometheus (promtool); on a machine without them
these tests skip locally but fail under CI, so a missing install step cannot hide.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: .ci/run must install it")
        pytest.skip(f"{name} is not installed (make ci-tools installs it)")
    return path


@pytest.mark.parametrize(
    "profile", [[], ["--profile", "cpu"], ["--profile", "sentinel"]], ids=["gpu", "cpu", "sentinel"]
)
def test_compose_file_is_valid(profile):
    result = subprocess.run(
        [_tool("docker-compose"), *profile, "-f", "compose.yaml", "config"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "worker:" in result.stdout and "gateway:" in result.stdout
    if profile == ["--profile", "cpu"]:
        assert "worker-cpu:" in result.stdout
    if profile == ["--profile", "sentinel"]:
        for service in ("redis-replica-1", "redis-replica-2", "sentinel-1", "sentinel-2", "sentinel-3"):
            assert f"  {service}:" in result.stdout, service
        assert "sentinel monitor arbor redis 6379 2" in result.stdout


def test_the_sentinel_profile_url_reaches_the_gateway_and_workers():
    sentinels = "redis+sentinel://sentinel-1:26379,sentinel-2:26379,sentinel-3:26379/arbor"
    env = dict(os.environ, REDIS_URL=sentinels, ARBOR_REDIS_MIN_REPLICAS="1")
    result = subprocess.run(
        [_tool("docker-compose"), "--profile", "sentinel", "-f", "compose.yaml", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in ("gateway", "worker"):
        assert services[name]["environment"]["REDIS_URL"] == sentinels
        assert services[name]["environment"]["ARBOR_REDIS_MIN_REPLICAS"] == "1"


def test_prometheus_config_is_valid():
    result = subprocess.run(
        [_tool("promtool"), "check", "config", "ops/deploy/prometheus/prometheus.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_json_is_what_the_generator_writes():
    from ops.deploy.grafana.build_dashboard import OUT, dashboard

    assert json.loads(OUT.read_text()) == dashboard(), "run: python -m ops.deploy.grafana.build_dashboard"
