"""The worker's capacity gate on real (tiny) loaded models: the context follows the model's own
maximum when the cache holds it, else the longest lane that fits in whole blocks; a hybrid's
lanes are as many as the cache holds recurrent states for, and the pool the worker builds has
exactly the blocks and state slots the gate counted."""

from __future__ import annotations

import pytest

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.tiny_models import make_tiny_model
from worker.models.capacity import CapacityError, kv_bytes_per_token, state_bytes_per_lane
from worker.models.hybrid.hybrid_pool import HybridPool
from worker.models.pool_factory import new_pool
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
    start = start_capacity(runner, None, None, 4 * one_lane + (1 << 20), max_lanes=4)
    assert runner.max_context == LONG  # nothing asked: the model's max_position_embeddings
    assert (start.max_context, start.limit_note, start.max_lanes) == (LONG, "", 4)
    assert start.capacity.contexts == 4 and start.capacity.context == LONG


def test_a_small_hybrid_cache_serves_the_longest_lane_that_fits(hybrid):
    runner = hybrid.runner
    shape = decoder_shape(runner)
    per_token, per_lane = kv_bytes_per_token(shape, "float32"), state_bytes_per_lane(shape, "float32")
    budget = per_lane + 3000 * per_token + per_token // 2
    start = start_capacity(runner, None, budget, 1 << 30, max_lanes=1)
    scratch = runner.max_draft_nodes + 1
    assert start.max_context == 93 * 32 - scratch  # whole blocks, less a verification's scratch rows
    assert start.kv_cache_bytes == budget
    assert "ARBOR_KV_CACHE_BYTES" in start.limit_note and str(budget) in start.limit_note
    assert start.capacity.max_lane_tokens == 93 * 32


def test_a_hybrid_runs_as_many_lanes_as_the_cache_holds_states_for(hybrid):
    runner = hybrid.runner
    per_lane = state_bytes_per_lane(decoder_shape(runner), "float32")
    budget = 6 * per_lane + 100  # half of it: three states
    start = start_capacity(runner, None, budget, 1 << 30, max_lanes=8)
    assert start.max_lanes == 3
    pool = new_pool(runner.decoder, budget, max_lanes=8)
    assert isinstance(pool, HybridPool) and pool.max_lanes == pool.states.num_slots == 3
    block_bytes = 32 * kv_bytes_per_token(decoder_shape(runner), "float32")
    assert pool.num_blocks == (budget - 3 * per_lane) // block_bytes
    assert start.max_context == pool.num_blocks * 32 - (runner.max_draft_nodes + 1)
    # what the worker publishes is the pool's: its slots, its blocks' tokens, one context of the longest
    assert (start.capacity.state_lanes, start.capacity.kv_tokens) == (3, pool.num_blocks * 32)
    assert start.capacity.contexts == 1


def test_a_plain_models_lanes_fit_in_whole_blocks(plain):
    runner = plain.runner
    per_token = kv_bytes_per_token(decoder_shape(runner), "float32")
    start = start_capacity(runner, None, 5 * 32 * per_token + 31 * per_token, 1 << 30, max_lanes=4)  # 5 blocks
    assert start.capacity.kv_tokens == 160
    assert start.max_context == 160 - (runner.max_draft_nodes + 1)


def test_a_cache_too_small_for_one_token_is_refused_at_start(plain):
    with pytest.raises(CapacityError, match="ARBOR_KV_CACHE_BYTES"):
        start_capacity(plain.runner, None, 100, 1 << 30, max_lanes=1)
