"""The capacity arithmetic against figures worked by hand for real model sizes, and its model
shapes against real (tiny) checkpoints and the caches the worker really allocates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.tiny_models import make_tiny_model
from tests.worker.models.real_size_configs import LLAMA_3_8B, QWEN3_5_27B, QWEN3_8B, QWEN3_NEXT_80B_A3B
from worker.models.capacity import (
    CapacityError,
    cache_budget,
    capacity,
    kv_bytes_per_token,
    parse_bytes,
    state_bytes_per_lane,
    weight_bytes,
)
from worker.models.config import ModelConfig
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.hybrid_cache import HybridCache
from worker.models.kv_pool import KVPool
from worker.models.model_shape import model_shape

GB = 10**9


def _fit(raw: dict, context: int, device_gb: int, weight_format: str = "bfloat16", block_tokens: int = 1):
    shape = model_shape(raw)
    weights = weight_bytes(shape, weight_format, "bfloat16")
    budget = cache_budget(weights, device_memory_bytes=device_gb * GB)
    return capacity(shape, context, weight_format, "bfloat16", budget, weights, block_tokens)


def test_llama_3_8b_figures():
    # embeddings 128,256 x 4,096 = 525,336,576, the lm_head as many;
    # a layer: q 4,096 x 4,096 = 16,777,216, k and v 1,024 x 4,096 = 4,194,304 each, o 16,777,216,
    # MLP 3 x 14,336 x 4,096 = 176,160,768: 218,103,808, x 32 = 6,979,321,856; norms 2 x 4,096 x 32
    # = 262,144 and 4,096: 8,030,261,248 parameters, 16,060,522,496 B in bfloat16.
    shape = model_shape(LLAMA_3_8B)
    assert shape.num_params == 8_030_261_248
    assert weight_bytes(shape, "bfloat16", "bfloat16") == 16_060_522_496
    # int4: the 7,504,658,432 linear weights at half a byte + 8 B per 32 (0.75 B), the other
    # 525,602,816 in bfloat16: 5,628,493,824 + 1,051,205,632.
    assert weight_bytes(shape, "int4", "bfloat16") == 6_679_699_456
    # int8: a byte each + a float32 scale per row (1,504,512 rows): 7,504,658,432 + 6,018,048 + 1,051,205,632.
    assert weight_bytes(shape, "int8", "bfloat16") == 8_561_882_112
    # K/V a token: 2 x 32 layers x 8 heads x 128 x 2 B = 131,072.
    # On 24 GB: 0.9 x 24e9 - 16,060,522,496 = 5,539,477,504 B of cache; in 32-token blocks of
    # 4,194,304 B that is 1,320 blocks = 42,240 tokens; contexts of 8,192 (1,073,741,824 B): 5.
    fit = _fit(LLAMA_3_8B, 8192, 24, block_tokens=32)
    assert (fit.kv_bytes_per_token, fit.state_bytes_per_lane) == (131_072, 0)
    assert (fit.cache_bytes, fit.kv_tokens, fit.contexts, fit.state_lanes) == (5_539_477_504, 42_240, 5, 0)
    assert fit.max_lane_tokens == 42_240


def test_qwen3_8b_figures():
    # embeddings and head 151,936 x 4,096 = 622,329,856 each; a layer: q 16,777,216, k + v 8,388,608,
    # o 16,777,216, MLP 3 x 12,288 x 4,096 = 150,994,944: 192,937,984, x 36 = 6,945,767,424;
    # norms (2 x 4,096 + q/k norms 2 x 128) x 36 = 304,128, final 4,096: 8,190,735,360.
    shape = model_shape(QWEN3_8B)
    assert shape.num_params == 8_190_735_360
    # K/V a token: 2 x 36 x 8 x 128 x 2 = 147,456 B. On 80 GB: 72e9 - 16,381,470,720 = 55,618,529,280
    # B; / 147,456 = 377,187 tokens; a 40,960-token context is 6,039,797,760 B: 9 fit.
    fit = _fit(QWEN3_8B, 40960, 80)
    assert fit.weight_bytes == 16_381_470_720
    assert (fit.kv_bytes_per_token, fit.cache_bytes, fit.kv_tokens, fit.contexts) == (
        147_456,
        55_618_529_280,
        377_187,
        9,
    )


def test_qwen3_next_80b_a3b_figures():
    # K/V for the 12 attention layers of 48: 2 x 12 x 2 heads x 256 x 2 B = 24,576 B a token.
    # State, per DeltaNet layer (36): conv tail (2 x 16 x 128 + 32 x 128 = 8,192 channels) x 3 x 2 B
    # = 49,152, delta-rule state 32 x 128 x 128 x 4 B = 2,097,152: 2,146,304, x 36 = 77,266,944 B.
    shape = model_shape(QWEN3_NEXT_80B_A3B)
    assert kv_bytes_per_token(shape, "bfloat16") == 24_576
    assert state_bytes_per_lane(shape, "bfloat16") == 77_266_944
    # Parameters: embeddings + head 2 x 311,164,928; attention 12 x (q+gate 16,777,216 + k, v
    # 2,097,152 + o 8,388,608) = 327,155,712, q/k norms 6,144; DeltaNet 36 x (qkvz 25,165,824 + ba
    # 131,072 + out 8,388,608) = 1,212,678,144, conv/dt/A/norm 36 x 32,960 = 1,186,560; MoE 48 x
    # (512 experts x 3,145,728 + shared 3,145,728 + router 1,048,576 + gate 2,048) =
    # 77,510,836,224; norms 196,608 + 2,048: 79,674,391,296.
    assert shape.num_params == 79_674_391_296
    # bfloat16 weights (159 GB) leave nothing on 80 GB.
    assert _fit(QWEN3_NEXT_80B_A3B, 262144, 80).contexts == 0
    # int4: 79,311,405,056 linear weights x 0.75 + 362,986,240 x 2 = 60,209,526,272 B. On 80 GB
    # 11,790,473,728 B of cache: one 262,144-token context (24,576 x 262,144 + 77,266,944 =
    # 6,519,717,888 B), 152 lanes' states; on 141 GB 66,690,473,728 B: 10 contexts.
    fit = _fit(QWEN3_NEXT_80B_A3B, 262144, 80, "int4")
    assert (fit.weight_bytes, fit.cache_bytes, fit.contexts, fit.state_lanes) == (
        60_209_526_272,
        11_790_473_728,
        1,
        152,
    )
    assert _fit(QWEN3_NEXT_80B_A3B, 262144, 141, "int4").contexts == 10


def test_qwen3_5_27b_figures():
    # K/V: 2 x 16 attention layers x 4 heads x 256 x 2 B = 65,536 B a token. State per DeltaNet
    # layer (48): conv (2 x 16 x 128 + 48 x 128 = 10,240) x 3 x 2 B = 61,440, delta 48 x 128 x 128
    # x 4 B = 3,145,728: 3,207,168, x 48 = 153,944,064 B.
    # Parameters: embeddings + head 2 x 1,271,398,400; attention 16 x 104,857,600; q/k norms 8,192;
    # DeltaNet 48 x (qkvz 83,886,080 + ba 491,520 + out 31,457,280) = 5,560,074,240 and 48 x 41,184;
    # MLP 64 x 267,386,880; norms 655,360 + 5,120: 26,895,998,464.
    shape = model_shape(QWEN3_5_27B)
    assert shape.num_params == 26_895_998_464
    # On 80 GB in bfloat16: 72e9 - 53,791,996,928 = 18,208,003,072 B. One 262,144-token context is
    # 17,179,869,184 + 153,944,064 = 17,333,813,248 B: 1 fits; 118 lanes' states; the longest lane
    # (18,208,003,072 - 153,944,064) / 65,536 = 275,483 tokens.
    fit = _fit(QWEN3_5_27B, 262144, 80)
    assert (fit.kv_bytes_per_token, fit.state_bytes_per_lane) == (65_536, 153_944_064)
    assert (fit.cache_bytes, fit.contexts, fit.state_lanes, fit.max_lane_tokens) == (
        18_208_003_072,
        1,
        118,
        275_483,
    )


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5_text", "qwen3_next"])
def test_parameter_count_matches_a_real_checkpoint(tmp_path, family):
    folder = tmp_path / family
    if family.startswith("qwen3_"):
        make_tiny_hybrid_model(folder, family)
    else:
        make_tiny_model(folder, family)
    with safe_open(str(folder / "model.safetensors"), "pt") as weights:
        stored = sum(_numel(weights, name) for name in weights.keys())  # noqa: SIM118 (safe_open has no __iter__)
    assert model_shape(read_config(folder)).num_params == stored


def read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _numel(weights, name: str) -> int:
    count = 1
    for size in weights.get_slice(name).get_shape():
        count *= size
    return count


@pytest.mark.parametrize("family", ["qwen3_5_text", "qwen3_next"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hybrid_bytes_match_the_cache_the_worker_allocates(tmp_path, family, dtype):
    raw = read_config(make_tiny_hybrid_model(tmp_path / family, family))
    cache = HybridCache(HybridConfig.from_hf(raw), 8, dtype)
    name = str(dtype).removeprefix("torch.")
    shape = model_shape(raw)
    assert kv_bytes_per_token(shape, name) == cache.bytes_per_token()
    assert state_bytes_per_lane(shape, name) == cache.recurrent.num_bytes
    fit = capacity(shape, 1, name, name, cache.num_bytes)
    assert fit.max_lane_tokens == 8  # the budget of an 8-token cache holds exactly that lane


def test_plain_bytes_match_the_pool_the_worker_allocates(tmp_path):
    raw = read_config(make_tiny_model(tmp_path / "qwen3", "qwen3"))
    block = KVPool.block_bytes(ModelConfig.from_hf(raw), 32, torch.float32)
    fit = capacity(model_shape(raw), 100, "float32", "float32", 5 * block + block // 2, block_tokens=32)
    assert fit.kv_bytes_per_token * 32 == block
    assert (fit.kv_tokens, fit.contexts, fit.max_lane_tokens) == (160, 1, 160)  # whole blocks only; 100 takes 4


def test_sizes_parse_and_bad_ones_are_named():
    assert parse_bytes("80GB") == 80 * GB
    assert parse_bytes("141 GB") == 141 * GB
    assert parse_bytes("24GiB") == 24 << 30
    assert parse_bytes("1000") == 1000
    with pytest.raises(CapacityError, match="80x"):
        parse_bytes("80x")
    with pytest.raises(CapacityError, match="format='int3'"):
        weight_bytes(model_shape(LLAMA_3_8B), "int3", "bfloat16")
