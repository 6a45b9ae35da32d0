"""The bytes a loaded model holds (held_bytes.py) and the capacity gate's weights figure.

The oracle for a loaded int4 model is the sum of its parts, each counted by the class that owns
it: the dense parameters, each torch int4 kernel's packed buffers, the quantized head's kept
source and the refined head's exact weight (an untied head's own: not a parameter). The held
figure must equal it, and the gate must log it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from tests.support.tiny_models import make_tiny_model
from worker.models.capacity import weight_bytes
from worker.models.held_bytes import held_tensor_bytes
from worker.models.planned_linear import PlannedLinear
from worker.models.quantized_linear import QuantizedLinear
from worker.serving.capacity_gate import decoder_shape, start_capacity
from worker.serving_model import load_serving_model


@dataclass(slots=True)
class _Slotted:
    tensor: torch.Tensor


def test_each_storage_counts_once_and_whole() -> None:
    shared = torch.zeros(100, dtype=torch.float32)  # 400 B
    module = nn.Linear(4, 2, bias=False)  # 8 float32: 32 B
    module.kept = _Slotted(torch.zeros(10, dtype=torch.int8))  # 10 B, outside parameters and buffers
    module.view = shared[:10]  # a view: its whole storage, once
    module.again = [shared, {"x": shared}]
    module.method = module.forward  # a bound method: not followed into the process's globals
    assert held_tensor_bytes(module) == 400 + 32 + 10
    assert held_tensor_bytes(module, shared) == 442


def test_the_gate_logs_the_bytes_an_int4_model_holds(tmp_path: Path) -> None:
    served = load_serving_model(
        make_tiny_model(tmp_path / "qwen3", "qwen3"), "none", dtype="auto", quantize="int4", kernels="torch"
    )
    decoder = served.runner.decoder
    dense = [*decoder.parameters(), decoder.lm_head.weight]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in dense}
    kernels = [m.num_bytes for m in decoder.modules() if isinstance(m, QuantizedLinear)]
    head = next(m for m in decoder.lm_head.modules() if isinstance(m, PlannedLinear))
    assert head.source is not None
    source = sum(t.numel() * t.element_size() for t in (head.source.q, head.source.scales, head.source.mins))
    expected = sum(storages.values()) + sum(kernels) + source
    assert held_tensor_bytes(decoder) == expected
    start = start_capacity(served.runner, "int4", 1 << 20, 1 << 20, max_lanes=2)
    assert start.capacity.weight_bytes == expected
    # one copy of each linear: a dense bfloat16 twin (2 B a weight) would put the held bytes past the
    # one-copy arithmetic by more than a byte a weight (the head's kept source and exact weight are less)
    shape = decoder_shape(served.runner)
    assert expected < weight_bytes(shape, "int4", "float32") + shape.num_linear_params
