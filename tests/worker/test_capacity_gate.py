"""The worker's capacity gate on real (tiny) loaded models: the context follows the model's own
maximum when the cache holds it, else the longest lane that fits, to the token or block."""

from __future__ import annotations

import pytest

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.tiny_models import make_tiny_model
from worker.models.capacity import CapacityError, kv_bytes_per_token, state_bytes_per_lane
from worker.serving.capacity_gate import decoder_shape, start_capacity
from worker.serving_model import load_serving_model

LONG = 262144


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory):
    folder = make_tiny_hybrid_model(
        tmp_path_factory.mktemp("gate") / "next", "qwen3_next", max_position_embeddings=LONG
    )
    return load_serving_model(folder, "none")


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory):
    return load_serving_model(make_tiny_model(tmp_path_factory.mktemp("gate") / "qwen3", "qwen3"), "none")


def test_the_context_follows_the_models_maximum_when_the_cache_holds_it(hybrid):
    runner = hybrid.runner
    shape = decoder_shape(runner)
    one_lane = LONG * kv_bytes_per_token(shape, "float32") + state_bytes_per_lane(shape, "float32")
    start = start_capacity(runner, None, None, 4 * one_lane + (1 << 20))
    assert runner.max_context == LONG  # nothing asked: the model's max_position_embeddings
    assert (start.max_context, start.limit_note) == (LONG, "")
    assert start.capacity.contexts == 4 and start.capacity.context == LONG


def test_a_small_hybrid_cache_serves_the_longest_lane_that_fits(hybrid):
    runner = hybrid.runner
    shape = decoder_shape(runner)
    per_token, per_lane = kv_bytes_per_token(shape, "float32"), state_bytes_per_lane(shape, "float32")
    budget = per_lane + 3000 * per_token + per_token // 2
    start = start_capacity(runner, None, budget, 1 << 30)
    scratch = runner.max_draft_nodes + 1
    assert start.max_context == 3000 - scratch  # a verification's scratch rows are part of a lane
    assert start.kv_cache_bytes == budget
    assert "ARBOR_KV_CACHE_BYTES" in start.limit_note and str(budget) in start.limit_note
    assert (start.capacity.kv_tokens, start.capacity.max_lane_tokens) == ((budget // per_token), 3000)


def test_a_plain_models_lanes_fit_in_whole_blocks(plain):
    runner = plain.runner
    per_token = kv_bytes_per_token(decoder_shape(runner), "float32")
    start = start_capacity(runner, None, 5 * 32 * per_token + 31 * per_token, 1 << 30)  # 5 blocks and a bit
    assert start.capacity.kv_tokens == 160
    assert start.max_context == 160 - (runner.max_draft_nodes + 1)


def test_a_cache_too_small_for_one_token_is_refused_at_start(plain):
    with pytest.raises(CapacityError, match="ARBOR_KV_CACHE_BYTES"):
        start_capacity(plain.runner, None, 100, 1 << 30)
