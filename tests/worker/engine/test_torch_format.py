"""The torch fallback's format (int4 weights on PyTorch's own kernels, `--kernels torch`) gives a
row the same bits alone and beside other rows: a batched lane emits what the request emits alone,
token for token, with prefill chunks and decode rows of other lanes in its steps. Before the
format was a rule, start-up timing could serve prefill chunks of some row counts from a bfloat16
twin, so a lane's K/V (and so its tokens) depended on how many rows shared its steps. The oracle
is plain decoding of the request alone, in the same format.
"""

from __future__ import annotations

import functools

import pytest

from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from tests.worker.engine.test_batched_engine import lanes_for, run_batched
from tests.worker.speculation.test_lossless import decode
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loaded_model import LoadedModel
from worker.models.loader import load_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def on_torch(family: str) -> LoadedModel:
    model = load_model(speculation_checkpoints(family).target, dtype="auto", quantize="int4", kernels="torch")
    assert model.formats is not None and model.formats.kernels == "torch" and model.formats.formats == ("int4",)
    return model


@functools.cache
def torch_runner(family: str, mode: str) -> ModelRunner:
    model = on_torch(family)
    options = DraftOptions(draft=speculation_checkpoints(family).dflash if mode in ("dflash", "tree") else None)
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids, load_drafter(mode, model, options))


@pytest.mark.parametrize("mode", ["none", "mtp"])
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_batched_lane_emits_what_it_emits_alone_on_the_torch_kernels(family: str, mode: str) -> None:
    lanes = lanes_for(family, num=8)
    outputs, pool, _, lanes_per_step = run_batched(torch_runner(family, mode), lanes)
    assert max(lanes_per_step) >= 4, "lanes did share steps"
    for name, prompt, params in lanes:
        assert outputs[name] == decode(torch_runner(family, "none"), prompt, params, SpecStats()), name
    assert pool.allocator.num_used == 0
