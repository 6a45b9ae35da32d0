"""Request bodies the agent CLIs really sent (captured from Codex 0.171.0, OpenCode 1.18.33 and Qwen
Code 0.24.4, model renamed), replayed against a scripted worker: each one is answered with a
well-formed stream, every field in it is a known one (nothing ignored, nothing refused), and
their max_tokens of 32000 reaches the worker lowered to ARBOR_MAX_TOKENS_CAP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer

BODIES = sorted((Path(__file__).parent / "agent_bodies").glob("*.json"))
CAP = 8192  # ARBOR_MAX_TOKENS_CAP's default
DEFAULT_MAX_TOKENS = 1024  # ARBOR_DEFAULT_MAX_TOKENS's: Codex sends no max_output_tokens


def _stream_frames(gateway: GatewayServer, path: str, body: dict) -> list[str]:
    with gateway.http().stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        return [frame for frame in response.read().decode().split("\n\n") if frame]


@pytest.mark.parametrize("captured", BODIES, ids=[path.stem for path in BODIES])
def test_a_captured_agent_request_is_answered(gateway: GatewayServer, peer: ProtocolPeer, captured: Path) -> None:
    recorded = json.loads(captured.read_text())
    body = recorded["body"] | {"model": MODEL}

    frames = _stream_frames(gateway, recorded["path"], body)

    if recorded["path"] == "/v1/responses":
        assert frames[-1].startswith("event: response.completed"), frames[-1][:200]
    else:
        assert frames[-1] == "data: [DONE]" and '"finish_reason":"stop"' in "".join(frames)
    (job,) = peer.jobs
    sent = json.loads(job.body)
    assert body.get("max_tokens") in (None, 32000)
    assert sent["max_tokens"] == (DEFAULT_MAX_TOKENS if body.get("max_tokens") is None else CAP)
    metrics = gateway.http().get("/metrics").text
    ignored = [line for line in metrics.splitlines() if line.startswith("arbor_ignored_request_fields_total{")]
    assert ignored == [], ignored
