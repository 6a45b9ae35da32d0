"""A DFlash drafter beside a quantized target (int4 or int8) holds fc and its layers' linears in
int8 (weight_formats.py's rule for drafters). Its layers compute the dense drafter over the
dequantized weights (the oracle) up to the kernels' rounding of the activations, and stay near the
dense drafter's own outputs: the same block from the same target hidden states moves by a weight's
rounding (measured 1.7% for int8 on these random weights; int4 would move it 19%), and does move
(the layers really are quantized). Lossless speculation in these formats: test_native_format
(plain targets) and tests/worker/models/hybrid/test_hybrid_quantized_speculation.py (hybrids).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torch import nn

from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.drafters.dflash import DFlashDrafter, DFlashState
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import TargetStates
from worker.kernels.native_linear import NativeQuantizedLinear
from worker.kernels.packing import as_native_sees
from worker.kernels.quantized_weight import quantize_int8
from worker.models.kv_cache import KVCache
from worker.models.loader import load_model
from worker.models.planned_linear import PlannedLinear

NUM_COMMITTED = 12
# the most the block's output may move, relative to the dense drafter's: an int8 weight's rounding
# (1/256 of its row's range) through fc and one layer, measured 1.7%
TOLERANCE = 0.03
# against the dense drafter over the dequantized weights: the activations' rounding (two int8 terms)
ORACLE_TOLERANCE = 1e-3


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def drafter(weight_format: str) -> DFlashDrafter:
    checkpoints = speculation_checkpoints("qwen3")
    if weight_format == "dense":
        model = load_model(checkpoints.target, dtype="float32")
    else:
        model = load_model(checkpoints.target, dtype="auto", quantize=weight_format, kernels="native")
    loaded = load_drafter("dflash", model, DraftOptions(draft=checkpoints.dflash))
    assert isinstance(loaded, DFlashDrafter)
    return loaded


def dequantized_drafter() -> DFlashDrafter:
    """The dense drafter with every linear's weight replaced by its int8 values, as the native
    kernels hold them."""
    oracle = copy.deepcopy(drafter("dense"))
    with torch.no_grad():
        for module in oracle.model.modules():
            if isinstance(module, nn.Linear):
                module.weight.copy_(as_native_sees(quantize_int8(module.weight.float())).dequantize())
    return oracle


def hidden_states(drafter: DFlashDrafter) -> dict[int, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    size = drafter.config.hidden_size
    return {layer: 3 * torch.randn(NUM_COMMITTED, size, generator=generator) for layer in drafter.spec.target_layer_ids}


def block_output(drafter: DFlashDrafter, hidden: dict[int, torch.Tensor], root: int) -> torch.Tensor:
    """The draft layers' output over one block after `hidden` (the target's layer outputs) is observed."""
    weight = drafter.embed_tokens.weight
    state = DFlashState(KVCache(drafter.config, NUM_COMMITTED + drafter.spec.block_size, weight.dtype, weight.device))
    drafter.observe(state, TargetStates(list(range(NUM_COMMITTED)), 0, hidden, None, root))
    return drafter._blocks([state], [root])


@pytest.mark.parametrize("target_format", ["int4", "int8"])
def test_every_drafter_linear_is_int8_beside_a_quantized_target(target_format: str) -> None:
    model = drafter(target_format).model
    planned = [m for m in model.modules() if isinstance(m, PlannedLinear)]
    assert not [m for m in model.modules() if isinstance(m, nn.Linear)], "a linear left dense"
    assert len(planned) == 1 + 7 * len(model.layers)  # fc, then q/k/v/o and gate/up/down per layer
    assert all(m.weight_format == "int8" and isinstance(m.module, NativeQuantizedLinear) for m in planned)


def test_a_dense_target_keeps_a_dense_drafter() -> None:
    model = drafter("dense").model
    assert not [m for m in model.modules() if isinstance(m, PlannedLinear)]


@pytest.mark.parametrize("target_format", ["int4", "int8"])
def test_the_layers_compute_the_dense_drafter_over_dequantized_weights(target_format: str) -> None:
    oracle = dequantized_drafter()
    hidden = hidden_states(oracle)
    expected = block_output(oracle, hidden, root=7)
    got = block_output(drafter(target_format), hidden, root=7)
    relative = ((got - expected).norm() / expected.norm()).item()
    assert relative < ORACLE_TOLERANCE, relative


@pytest.mark.parametrize("target_format", ["int4", "int8"])
def test_the_layers_outputs_stay_near_the_dense_drafters(target_format: str) -> None:
    dense = drafter("dense")
    hidden = hidden_states(dense)
    expected = block_output(dense, hidden, root=7)
    got = block_output(drafter(target_format), hidden, root=7)
    relative = ((got - expected).norm() / expected.norm()).item()
    assert 1e-5 < relative < TOLERANCE, relative
