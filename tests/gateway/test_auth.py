"""Bearer-key auth: off by default; with keys, 401 in the envelope unless a configured key is sent."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer

MESSAGES = [{"role": "user", "content": "hi"}]


def test_no_keys_configured_means_no_auth(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    response = gateway.http().post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES})

    assert response.status_code == 200


@pytest.mark.parametrize("header", [None, "Bearer wrong", "Bearer key-one-x", "Basic key-one", "Bearer", "key-one"])
def test_missing_or_wrong_key_is_401_in_the_envelope(make_gateway, peer: ProtocolPeer, header: str | None) -> None:
    gateway = make_gateway(api_keys="key-one,key-two")
    headers = {"authorization": header} if header else {}

    response = gateway.http().post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}, headers=headers)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"
    assert response.json()["error"]["type"] == "authentication_error"
    assert peer.jobs == []


def test_any_configured_key_is_accepted(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(api_keys="key-one,key-two")

    for key in ("key-one", "key-two"):
        reply = gateway.openai(api_key=key).chat.completions.create(model=MODEL, messages=MESSAGES)
        assert reply.choices[0].message.content == "Hello, world"
    with pytest.raises(openai.AuthenticationError):
        gateway.openai(api_key="key-three").models.list()


def test_health_and_metrics_are_open_unless_configured(make_gateway, peer: ProtocolPeer) -> None:
    open_ops = make_gateway(api_keys="k").http()
    closed_ops = make_gateway(api_keys="k", auth_health_metrics=True).http()

    assert open_ops.get("/health").status_code == 200
    assert open_ops.get("/metrics").status_code == 200
    assert open_ops.get("/v1/models").status_code == 401
    assert closed_ops.get("/health").status_code == 401
    assert closed_ops.get("/metrics").status_code == 401
    assert closed_ops.get("/health", headers={"authorization": "Bearer k"}).status_code == 200
