"""A decode step of greedy lanes reads back from the device once, whatever the number of lanes:
each lane's argmaxes travel together (on a GPU every read-back is a sync that stalls the queue)."""

from __future__ import annotations

import pytest
import torch

from shared.sampling import SamplingParams
from tests.worker.speculation.test_lossless import loaded, make_prompts, runner_for
from worker.engine.runner import LaneWork
from worker.models.kv_pool import KVPool


class ReadBacks:
    """Counts Tensor.tolist and Tensor.item calls (every way our code reads a tensor back)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.count = 0
        for name in ("tolist", "item"):
            original = getattr(torch.Tensor, name)

            def counted(tensor, *args, _original=original, **kwargs):
                self.count += 1
                return _original(tensor, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_a_decode_step_of_greedy_lanes_reads_back_once(monkeypatch, mode):
    runner = runner_for("qwen3", mode)
    decoder = runner.decoder
    pool = KVPool(decoder.config, 64, 8, decoder.dtype, decoder.device)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    prompts = make_prompts(loaded("qwen3").config.vocab_size, 5, seed=3)
    sequences = [runner.start(f"lane-{i}", prompt, params, pool=pool) for i, prompt in enumerate(prompts)]
    runner.step([LaneWork(sequence, sequence.num_to_prefill) for sequence in sequences])
    read_backs = ReadBacks(monkeypatch)
    works = [LaneWork(sequence) for sequence in sequences]
    runner.step(works)
    assert all(work.error is None and work.emitted for work in works)
    assert read_backs.count == 1
    for sequence in sequences:
        sequence.cache.release()
