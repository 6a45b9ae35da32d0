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

ROOT = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: .ci/run must install it")
        pytest.skip(f"{name} is not installed (make ci-tools installs it)")
    return path


@pytest.mark.parametrize("profile", [[], ["--profile", "cpu"]], ids=["gpu", "cpu"])
def test_compose_file_is_valid(profile):
    result = subprocess.run(
        [_tool("docker-compose"), *profile, "-f", "compose.yaml", "config"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert "worker:" in result.stdout and "gateway:" in result.stdout
    if profile:
        assert "worker-cpu:" in result.stdout


def test_prometheus_config_is_valid():
    result = subprocess.run(
        [_tool("promtool"), "check", "config", "ops/prometheus/prometheus.yml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_json_is_what_the_generator_writes():
    from ops.grafana.build_dashboard import OUT, dashboard

    assert json.loads(OUT.read_text()) == dashboard(), "run: python -m ops.grafana.build_dashboard"
