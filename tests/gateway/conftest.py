"""Fixtures: one private redis-server per session, a real uvicorn gateway per test, a peer worker."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis
import uvicorn
from starlette.types import ASGIApp

from gateway.app import create_app
from shared.settings import GatewaySettings
from tests.gateway.protocol_peer import ProtocolPeer
from tests.support.redis_server import RedisServer

MODEL = "tiny-model"


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client(decode_responses=True)
    client.flushall()
    yield client
    client.close()


class GatewayServer:
    """The real app on uvicorn, on a loopback port, in a thread."""

    def __init__(self, settings: GatewaySettings, wrap_app: Callable[[ASGIApp], ASGIApp] = lambda app: app) -> None:
        self.settings = settings
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(wrap_app(create_app(settings)), log_level="warning", lifespan="on")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._clients: list[openai.OpenAI | httpx.Client] = []  # closed in stop()

    def start(self) -> GatewayServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline, "gateway did not start"
            assert self._thread.is_alive(), "gateway thread died"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        for client in self._clients:
            client.close()
        self._server.should_exit = True
        self._thread.join(15)
        self._sock.close()

    def openai(self, api_key: str = "unused") -> openai.OpenAI:
        client = openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=20)
        self._clients.append(client)
        return client

    def http(self, **kwargs: Any) -> httpx.Client:
        client = httpx.Client(base_url=self.base_url, timeout=20, **kwargs)
        self._clients.append(client)
        return client


@pytest.fixture
def make_gateway(redis_client: redis.Redis, redis_server: RedisServer) -> Iterator[Callable[..., GatewayServer]]:
    started: list[GatewayServer] = []

    def make(wrap_app: Callable[[ASGIApp], ASGIApp] = lambda app: app, **overrides: Any) -> GatewayServer:
        options: dict[str, Any] = {
            "redis_url": redis_server.url,
            "event_poll_s": 0.2,
            "request_timeout_s": 10.0,
        }
        server = GatewayServer(GatewaySettings(**(options | overrides)), wrap_app).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def gateway(make_gateway: Callable[..., GatewayServer]) -> GatewayServer:
    return make_gateway()


@pytest.fixture
def make_peer(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[Callable[..., ProtocolPeer]]:
    peers: list[ProtocolPeer] = []

    def make(**options: Any) -> ProtocolPeer:
        peer = ProtocolPeer(redis_server.url, **({"model": MODEL} | options)).start()
        peers.append(peer)
        return peer

    yield make
    for peer in peers:
        peer.stop()
    for peer in peers:
        assert peer.problems == [], peer.problems


@pytest.fixture
def peer(make_peer: Callable[..., ProtocolPeer]) -> ProtocolPeer:
    return make_peer()
