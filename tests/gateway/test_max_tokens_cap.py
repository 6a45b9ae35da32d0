"""A max_tokens above ARBOR_MAX_TOKENS_CAP is lowered to the cap on every API, not refused (the
worker then lowers it to the room the prompt leaves: tests/e2e/test_agent_clients.py)."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import MODEL
from tests.gateway.protocol_peer import ProtocolPeer

USER = {"role": "user", "content": "hi"}
CAP = 100


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": MODEL, "messages": [USER], "max_tokens": 32000}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [USER], "max_completion_tokens": 32000}),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 32000}),
        ("/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 32000}),
        ("/v1/messages", {"model": MODEL, "messages": [USER], "max_tokens": 32000}),
    ],
)
def test_max_tokens_over_the_cap_is_lowered_to_it(make_gateway, peer: ProtocolPeer, path: str, body: dict) -> None:
    gateway = make_gateway(max_tokens_cap=CAP, default_max_tokens=16)

    reply = gateway.http().post(path, json=body)

    assert reply.status_code == 200, reply.text
    (job,) = peer.jobs
    sent = json.loads(job.body)
    assert (sent.get("max_completion_tokens") or sent["max_tokens"]) == CAP
