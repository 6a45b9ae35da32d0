"""Chunked prefill through the model runner equals one unchunked prefill: the same cache (K/V,
conv tails, delta-rule states) and the same greedy continuation, at odd chunk sizes.

In float64, so "the same" can be tight: in float32 these scaled-up random models amplify the
different summation order of other chunk boundaries to ~1e-4 in the states, which would hide a
state carried wrongly between chunks just as well as it hides rounding.
"""

from __future__ import annotations

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, make_tiny_hybrid_model
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import load_model

PROMPT_TOKENS = 90
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module", params=sorted(HYBRID_FAMILIES))
def runner(request, tmp_path_factory) -> ModelRunner:
    folder = make_tiny_hybrid_model(tmp_path_factory.mktemp(request.param), request.param)
    model = load_model(folder, dtype=torch.float64)
    return ModelRunner(model.decoder, model.checkpoint.eos_token_ids)


def _prefilled(runner: ModelRunner, max_chunk: int) -> Sequence:
    prompt = torch.randint(0, runner.vocab_size, (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(3))
    sequence = runner.start(f"chunk-{max_chunk}", prompt.tolist(), GREEDY)
    while sequence.num_to_prefill:
        runner.prefill(sequence, max_chunk)
    return sequence


def _decoded(runner: ModelRunner, sequence: Sequence) -> list[int]:
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence.output_ids


@pytest.mark.parametrize("max_chunk", [7, 13])
def test_chunked_prefill_equals_unchunked(runner, max_chunk):
    whole, chunked = _prefilled(runner, 4096), _prefilled(runner, max_chunk)
    assert chunked.stats.prefill_tokens == whole.stats.prefill_tokens == PROMPT_TOKENS - 1
    a, b = whole.cache, chunked.cache
    assert a.length == b.length == PROMPT_TOKENS - 1
    assert torch.allclose(a.keys[:, :, : a.length], b.keys[:, :, : b.length], atol=1e-10)
    assert torch.allclose(a.recurrent.conv_tails, b.recurrent.conv_tails, atol=1e-10)
    assert torch.allclose(a.recurrent.delta_states, b.recurrent.delta_states, atol=1e-10)
    assert a.recurrent.delta_states.abs().max() > 0.1  # the state holds something
    assert _decoded(runner, chunked) == _decoded(runner, whole)
