"""The agent CLIs themselves, installed from npm at their pinned versions (ops/agent_capture/
clis.py), each running one prompt against `arbor up` on the default model through the logging
proxy: exit 0, the model's answer printed, nothing they sent answered 4xx/5xx. Slow: the npm
installs, a model load and four agent runs on CPU (`make test-agents`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from ops.agent_capture.clis import AGENT_CLIS
from ops.agent_capture.runs import arbor_up, install_clis, logging_proxy, read_records, run_cli

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = REPO_ROOT / ".cache" / "agent-clis"
MODEL = "SmolLM2-135M-Instruct"
PROMPT = "Say hello in one short sentence."


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    install_clis(PREFIX, sorted(AGENT_CLIS), {})
    with arbor_up(None, tmp_path_factory.mktemp("up") / "up.log") as url:
        yield url


@pytest.mark.parametrize("name", sorted(AGENT_CLIS))
def test_agent_cli_answers_through_arbor(base_url: str, name: str, tmp_path: Path) -> None:
    with logging_proxy(base_url, tmp_path / "records") as proxy_url:
        run = run_cli(AGENT_CLIS[name], PREFIX / "node_modules" / ".bin", tmp_path, proxy_url, MODEL, PROMPT)
    run.records = read_records(tmp_path / "records")
    summary = json.dumps(run.summary(), indent=1)
    assert run.records, f"{name} sent nothing to Arbor\n{summary}"
    assert not run.failed_records(), f"{name}: requests answered with errors\n{summary}"
    assert run.returncode == 0, summary
    assert run.stdout.strip(), f"{name} printed no answer\n{summary}"
