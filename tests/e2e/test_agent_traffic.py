"""Recorded requests of real agent CLIs (tests/fixtures/agent_traffic/, `make agent-fixtures`)
replayed byte for byte against a real stack: each is answered 200 with a stream well-formed for
its API and tool calls whose arguments parse; with strict request fields the same bodies are
refused naming a field, so that setting is the only difference."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.agent_stack import AgentStack, agent_stack, fixture_paths
from tests.support.agent_streams import STREAM_CHECKS, parse_sse

REPLAY_TIMEOUT_S = 300.0  # a 30K-token prefill on two busy cores


@pytest.fixture(scope="module")
def replay_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentStack]:
    with agent_stack(tmp_path_factory.mktemp("models"), tmp_path_factory.mktemp("logs")) as stack:
        yield stack


def _fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def _replay(base_url: str, record: dict[str, Any]) -> httpx.Response:
    with httpx.Client(base_url=base_url, timeout=REPLAY_TIMEOUT_S) as client:
        content = json.dumps(record["body"]).encode() if record["body"] is not None else None
        response = client.request(record["method"], record["path"], headers=record["headers"], content=content)
        response.read()
        return response


FIXTURES = fixture_paths()


def test_every_agent_cli_has_recorded_traffic() -> None:
    clis = {path.parent.name.rsplit("-", 1)[0] for path in FIXTURES}
    assert clis == {"claude-code", "codex", "qwen-code", "opencode"}, clis


@pytest.mark.parametrize("path", FIXTURES, ids=_fixture_id)
def test_recorded_request_is_served(replay_stack: AgentStack, path: Path) -> None:
    record = json.loads(path.read_text())
    response = _replay(replay_stack.base_url, record)
    assert response.status_code == 200, f"{response.status_code}: {response.text[:2000]}"
    route = record["path"].split("?")[0]
    if not response.headers["content-type"].startswith("text/event-stream"):
        assert isinstance(response.json(), dict)
        return
    arguments = STREAM_CHECKS[route](parse_sse(response.text))
    for text in arguments:
        json.loads(text)  # every tool call's arguments are JSON


STRICT_REFUSED = [path for path in FIXTURES if json.loads(path.read_text())["method"] == "POST"]


@pytest.mark.parametrize("path", STRICT_REFUSED, ids=_fixture_id)
def test_strict_fields_refuse_recorded_request_naming_the_field(replay_stack: AgentStack, path: Path) -> None:
    record = json.loads(path.read_text())
    response = _replay(replay_stack.strict_url, record)
    if response.status_code == 200:
        pytest.skip("nothing in this body is unknown to Arbor")  # listed by -rs
    assert response.status_code == 400, response.text[:2000]
    error = response.json()["error"]
    assert error["param"] and error["param"] in error["message"], error
