"""The native format (worker/kernels/) keeps speculation lossless and a row's tokens independent of
the rows beside it: every mode equals plain decoding, a batched lane equals the request alone, one
thread equals two, token for token, on tiny models (through the fused native layers) and on the
default model. The oracle is plain decoding in the same format; these tests need the AVX-512 VNNI
path (both of the project's machine kinds have it) and skip elsewhere.
"""

from __future__ import annotations

import functools

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from tests.worker.engine.test_batched_engine import lanes_for, run_batched
from tests.worker.speculation.test_lossless import FAMILIES, decode, make_prompts
from worker.drafters.head_rows import HeadRows
from worker.drafters.mtp import MtpDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.generate import generate
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.kernels.native_lib import kernel_choice
from worker.kernels.native_linear import NativeQuantizedLinear
from worker.models.loader import LoadedModel, load_model
from worker.models.planned_linear import PlannedLinear
from worker.serving_model import ServingModel, load_serving_model

pytestmark = pytest.mark.skipif(
    kernel_choice("native").isa != "avx512_vnni", reason="the native layers run on AVX-512 VNNI only"
)
MODES = ("none", "mtp", "mtp-tree", "auto", "dflash", "tree", "ngram")
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def native(family: str) -> LoadedModel:
    model = load_model(speculation_checkpoints(family).target, dtype="auto", quantize="int4", kernels="native")
    assert model.formats is not None and model.formats.kernels == "native"
    assert model.decoder.fused is not None, "the tiny models' shapes take the fused native layers"
    return model


@functools.cache
def native_runner(family: str, mode: str) -> ModelRunner:
    model = native(family)
    options = DraftOptions(draft=speculation_checkpoints(family).dflash if mode in ("dflash", "tree") else None)
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids, load_drafter(mode, model, options))


def native_alone(family: str, prompt: list[int], params: SamplingParams) -> list[int]:
    return decode(native_runner(family, "none"), prompt, params, SpecStats())


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_mode_equals_plain_decoding_in_the_native_format(family: str, mode: str) -> None:
    prompts = make_prompts(native(family).config.vocab_size, 6, seed=21)
    stats = SpecStats()
    for prompt in prompts:
        expected = native_alone(family, prompt, GREEDY)
        assert decode(native_runner(family, mode), prompt, GREEDY, stats) == expected, mode


@pytest.mark.parametrize("mode", ["none", "mtp", "tree"])
def test_a_batched_lane_emits_what_it_emits_alone_in_the_native_format(mode: str) -> None:
    family = "llama"
    lanes = lanes_for(family, num=8)
    outputs, pool, _, lanes_per_step = run_batched(native_runner(family, mode), lanes)
    assert max(lanes_per_step) >= 4, "lanes did share steps"
    for name, prompt, params in lanes:
        assert outputs[name] == native_alone(family, prompt, params), name
    assert pool.allocator.num_used == 0


def test_the_fused_layers_compute_the_per_op_native_model() -> None:
    decoder = native("qwen3").decoder
    tokens = torch.tensor([5, 17, 99, 3, 42, 250, 7, 7, 31])
    fused = decoder(tokens, torch.arange(9), decoder.new_cache(16)).logits
    layers, decoder.fused = decoder.fused, None
    try:
        per_op = decoder(tokens, torch.arange(9), decoder.new_cache(16)).logits
    finally:
        decoder.fused = layers
    # the same model: only rounding differs (exp, norms and attention sums in another order)
    assert (fused - per_op).abs().max() <= 1e-3 * per_op.abs().max()


def test_the_heads_layer_is_int8_beside_an_int4_target_and_fused() -> None:
    drafter = native_runner("qwen3", "mtp").drafter
    assert isinstance(drafter, MtpDrafter) and drafter.fused is not None
    assert native("qwen3").formats.body == "int4"
    layer = drafter.head.layers[0]
    for linear in (drafter.head.fc, layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj):
        assert isinstance(linear, PlannedLinear) and linear.weight_format == "int8"
        assert isinstance(linear.module, NativeQuantizedLinear)


def test_the_heads_fused_layer_computes_its_per_op_layer() -> None:
    """A run of committed pairs, then tree rows that each see other ancestors' scratch slots: the
    fused call and the per-op layer (same int8 products) give the same outputs and K/V."""
    model = native("qwen3")
    drafter = native_runner("qwen3", "mtp").drafter
    assert isinstance(drafter, MtpDrafter) and drafter.fused is not None
    sequence = native_runner("qwen3", "mtp").start("fused", list(range(5, 17)), GREEDY)
    state = drafter.start(sequence)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, model.config.hidden_size, generator=generator)  # [rows, hidden]
    run = HeadRows(state.cache, list(range(20, 26)), list(range(6)), 0)
    tree = HeadRows(state.cache, [30, 31, 32, 33], [6, 6, 6, 6], 6, [[], [], [], []])  # depth-1 siblings

    def both(rows: HeadRows, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        keys = state.cache.keys.clone()
        fused = drafter.run_head([rows], x)
        fused_keys, state.cache.keys = state.cache.keys.clone(), keys
        layers, drafter.fused = drafter.fused, None
        try:
            per_op = drafter.run_head([rows], x)
        finally:
            drafter.fused = layers
        assert (fused_keys - state.cache.keys).abs().max() <= 1e-3 * state.cache.keys.abs().max()
        return fused, per_op

    fused, per_op = both(run, hidden[:6])
    assert (fused - per_op).abs().max() <= 1e-3 * per_op.abs().max()
    state.cache.commit(6)  # the run's pairs are committed: the tree rows below see them
    fused, per_op = both(tree, hidden[6:])
    assert (fused - per_op).abs().max() <= 1e-3 * per_op.abs().max()
    # depth 2 under the first two depth-1 rows (scratch slots 6 and 7): each sees its own parent only
    deeper = HeadRows(state.cache, [40, 40], [7, 7], 10, [[6], [7]])
    fused, per_op = both(deeper, torch.cat([hidden[:1], hidden[:1]]))
    assert (fused - per_op).abs().max() <= 1e-3 * per_op.abs().max()
    assert (fused[0] - fused[1]).abs().max() > 1e-3  # different parents: different outputs


@functools.cache
def default_served(mode: str) -> ServingModel:
    served = load_serving_model(None, mode, dtype="auto", kernels="native")
    assert served.loaded.decoder.fused is not None
    return served


def default_greedy(mode: str, prompts: list[str]) -> list[list[int]]:
    served = default_served(mode)
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    ids = [served.encode_chat([{"role": "user", "content": text}]) for text in prompts]
    return [generate(served.runner, served.tokenizer, prompt, params).token_ids for prompt in ids]


DEFAULT_PROMPTS = ["Name three rivers.", "Write a haiku about rain.", "What is 17 * 23?"]


@pytest.mark.parametrize("mode", ["mtp", "mtp-tree", "tree"])
def test_default_model_speculates_losslessly_in_its_default_format(mode: str) -> None:
    assert default_greedy(mode, DEFAULT_PROMPTS) == default_greedy("none", DEFAULT_PROMPTS)


def test_default_model_gives_the_same_tokens_on_one_thread_and_two() -> None:
    expected = default_greedy("none", DEFAULT_PROMPTS[:2])
    torch.set_num_threads(2)
    try:
        served = load_serving_model(None, "none", dtype="auto", kernels="native")
        params = SamplingParams(max_tokens=32, ignore_eos=True)
        ids = [served.encode_chat([{"role": "user", "content": text}]) for text in DEFAULT_PROMPTS[:2]]
        got = [generate(served.runner, served.tokenizer, prompt, params).token_ids for prompt in ids]
    finally:
        torch.set_num_threads(1)
    assert got == expected
