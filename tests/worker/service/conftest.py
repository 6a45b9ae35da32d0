"""Fixtures: a private redis-server per test, tiny random models shared by the whole session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.support.redis_server import RedisServer
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.tiny_models import make_tiny_model
from worker.serving_model import ServingModel, load_serving_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("service") / "tiny-qwen3", "qwen3")


@pytest.fixture(scope="session")
def served_none(tiny_model_dir: Path) -> ServingModel:
    return load_serving_model(tiny_model_dir, "none")


@pytest.fixture(scope="session")
def served_ngram(tiny_model_dir: Path) -> ServingModel:
    return load_serving_model(tiny_model_dir, "ngram")


@pytest.fixture(scope="session")
def tiny_hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-Next (gated DeltaNet, gated attention, sparse MoE): the same tests serve it."""
    return make_tiny_hybrid_model(tmp_path_factory.mktemp("service") / "tiny-qwen3-next", "qwen3_next")


@pytest.fixture(scope="session")
def served_hybrid(tiny_hybrid_dir: Path) -> ServingModel:
    return load_serving_model(tiny_hybrid_dir, "none")


@pytest.fixture(scope="session")
def served_hybrid_ngram(tiny_hybrid_dir: Path) -> ServingModel:
    return load_serving_model(tiny_hybrid_dir, "ngram")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    connection = redis_server.client(decode_responses=True)
    yield connection
    connection.close()
