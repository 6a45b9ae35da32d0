"""Recorded requests of real agent CLIs (tests/fixtures/agent_traffic/, `make agent-fixtures`)
replayed byte for byte against a real stack: each is answered 200 with a stream well-formed for
its API and tool calls whose arguments parse; with strict request fields the same bodies are
refused naming a field, so that setting is the only difference."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

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


def _ignored_fields(base_url: str) -> dict[tuple[str, str], float]:
    """arbor_ignored_request_fields_total by (route, field), from the gateway's /metrics."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    counts: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "arbor_ignored_request_fields_total":
                counts[(sample.labels["route"], sample.labels["field"])] = sample.value
    return counts


def _names_field(message: str, label: str) -> bool:
    """`messages.*.content.*.caller` named as `messages.1.content.0.caller`."""
    return re.search(re.escape(label).replace(r"\*", r"\d+"), message) is not None


# Anthropic's top level and a tool definition's own fields are ignored under strict too
# (gateway/messages_api/request.py: `refused_when_strict = False`); top-level labels have no dot.
MESSAGES_IGNORED_WHEN_STRICT = {"tools.*.defer_loading", "tools.*.eager_input_streaming", "tools.*.cache_control"}

POSTS = [path for path in FIXTURES if json.loads(path.read_text())["method"] == "POST"]


@pytest.mark.parametrize("path", POSTS, ids=_fixture_id)
def test_strict_fields_are_the_only_difference(replay_stack: AgentStack, path: Path) -> None:
    """Each body once more on the lenient gateway, counting what it ignored, then on the strict
    one: nothing ignored, both serve it; else strict refuses it naming an ignored field, or (for
    Anthropic's top-level and tool-definition fields, ignored under both) serves it."""
    record = json.loads(path.read_text())
    before = _ignored_fields(replay_stack.base_url)
    lenient = _replay(replay_stack.base_url, record)
    after = _ignored_fields(replay_stack.base_url)
    ignored = {field for (route, field), count in after.items() if count > before.get((route, field), 0.0)}
    strict = _replay(replay_stack.strict_url, record)
    assert lenient.status_code == 200, lenient.text[:2000]
    if strict.status_code == 200:
        kept = ignored - MESSAGES_IGNORED_WHEN_STRICT if record["path"].startswith("/v1/messages") else ignored
        assert not {label for label in kept if "." in label or not record["path"].startswith("/v1/messages")}, (
            f"strict served a body with unknown fields {kept}"
        )
        return
    assert strict.status_code == 400, strict.text[:2000]
    assert any(_names_field(strict.text, label) for label in ignored), f"{strict.text[:2000]} names none of {ignored}"
