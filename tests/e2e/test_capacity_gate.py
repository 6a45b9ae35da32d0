"""A tiny Qwen3-Next with a 262,144-token max_position_embeddings served by a real worker whose
cache (ARBOR_KV_CACHE_BYTES) holds far less, behind the real gateway: the worker serves the
longest lane that fits, publishes what fits in /health, /v1/models and its own /metrics, and a
request that could never fit is a 400 naming the limit (not a stall), asked through the openai SDK."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import openai
import pytest

from shared.settings import GatewaySettings
from tests.gateway.conftest import GatewayServer
from tests.support.redis_server import RedisServer
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.waiting import wait_for
from tests.worker.service.harness import InProcessWorker, service_config
from worker.models.capacity import kv_bytes_per_token, state_bytes_per_lane
from worker.serving.capacity_gate import decoder_shape
from worker.serving_model import load_serving_model

MODEL = "tiny-qwen3-next-long"
LANE_TOKENS = 1024  # what the cache holds for one lane (32 blocks), scratch rows included


@dataclass
class Served:
    gateway: GatewayServer
    metrics_url: str
    max_context: int
    kv_bytes_per_token: int
    cache_bytes: int


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = make_tiny_hybrid_model(
        tmp_path_factory.mktemp("gate") / MODEL, "qwen3_next", max_position_embeddings=262144
    )
    model = load_serving_model(folder, "none")  # no max_context: the model's own
    shape = decoder_shape(model.runner)
    per_token = kv_bytes_per_token(shape, "float32")
    cache_bytes = state_bytes_per_lane(shape, "float32") + LANE_TOKENS * per_token
    max_context = LANE_TOKENS - (model.runner.max_draft_nodes + 1)
    port = _free_port()
    with RedisServer() as redis_server:
        config = service_config(
            redis_server.url,
            model_name=MODEL,
            max_context=None,
            kv_cache_bytes=cache_bytes,
            metrics_port=port,
            max_lanes=1,  # one state slot, the rest K/V blocks
        )
        with InProcessWorker(config, model):
            server = GatewayServer(GatewaySettings(redis_url=redis_server.url, request_timeout_s=120.0)).start()
            health = server.http()
            wait_for(lambda: health.get("/health").status_code == 200, 60, "the gateway to see the worker")
            yield Served(server, f"http://127.0.0.1:{port}/metrics", max_context, per_token, cache_bytes)
            server.stop()


def test_a_request_that_can_never_fit_is_a_400_naming_the_limit(served: Served) -> None:
    client = served.gateway.openai()
    too_long = [{"role": "user", "content": "Hello " * (served.max_context + 50)}]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=too_long, max_tokens=4)
    error = caught.value
    assert error.status_code == 400 and error.code == "context_length_exceeded"
    assert f"maximum context length is {served.max_context} tokens" in error.message
    assert "ARBOR_KV_CACHE_BYTES" in error.message and str(served.cache_bytes) in error.message


def test_a_max_tokens_past_what_fits_is_lowered_to_the_room_left(served: Served) -> None:
    client = served.gateway.openai()
    http = served.gateway.http()

    def prompt_tokens(words: int) -> int:
        messages = [{"role": "user", "content": "Hello " * words}]
        return int(http.post("/tokenize", json={"model": MODEL, "messages": messages}).json()["count"])

    per_word = prompt_tokens(11) - prompt_tokens(10)
    words = (served.max_context - 40 - prompt_tokens(0)) // per_word  # ~40 tokens of room left
    near_full = [{"role": "user", "content": "Hello " * words}]
    reply = client.chat.completions.create(
        model=MODEL, messages=near_full, max_tokens=served.max_context, temperature=0
    )
    assert reply.usage is not None and reply.usage.completion_tokens >= 1  # served, not refused
    assert reply.usage.prompt_tokens > served.max_context - 60  # so max_tokens had to be lowered
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens <= served.max_context


def test_health_and_models_publish_what_fits(served: Served) -> None:
    [worker] = served.gateway.http().get("/health").json()["workers"]
    capacity = worker["capacity"]
    assert worker["max_context"] == served.max_context
    assert capacity["kv_bytes_per_token"] == served.kv_bytes_per_token
    assert capacity["kv_cache_bytes"] == served.cache_bytes
    per_lane = capacity["state_bytes_per_lane"]
    assert per_lane > 0 and capacity["state_lanes"] == 1  # the pool's state slots: one lane (max_lanes)
    assert capacity["kv_tokens"] == LANE_TOKENS  # the blocks beside it
    assert capacity["max_context_lanes"] == 1  # whole contexts: one
    assert capacity["weight_bytes"] > 0
    [model] = served.gateway.openai().models.list().data
    assert model.model_extra["max_model_len"] == served.max_context
    metrics = served.gateway.http().get("/metrics").text
    assert f'arbor_max_context_lanes{{model="{MODEL}",speculation="none"}} 1.0' in metrics
    assert f'arbor_kv_capacity_tokens{{model="{MODEL}",speculation="none"}} {capacity["kv_tokens"]}.0' in metrics


def test_the_workers_metrics_carry_the_capacity(served: Served) -> None:
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        text = response.read().decode()
    lines = {line.split("{")[0]: line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith("arbor_")}
    assert float(lines["arbor_worker_kv_bytes_per_token"]) == served.kv_bytes_per_token
    assert float(lines["arbor_worker_max_context_tokens"]) == served.max_context
    assert float(lines["arbor_worker_max_context_lanes"]) == 1
