"""Chain speculation over recurrent state is lossless: n-gram (and suffix) speculation gives plain decoding's
greedy tokens exactly (float64, so a 4-row verification and a 1-row step cannot disagree on an
argmax through rounding), with drafts accepted; so does tree verification (an oracle drafter's
trees); modes whose drafter is not validated on hybrids are refused (dflash and tree are
served: test_hybrid_dflash; mtp runs the checkpoint's own head: tests/worker/drafters/test_hybrid_mtp).

Random hybrid models are too chaotic for prompt lookup: their greedy runs never revisit an n-gram.
So the target here has tied embeddings and its mixers' and MLPs' output projections damped: the
next token mostly follows the current one, runs fall into loops that lookup predicts, and the
mixers still move the argmax often enough that drafts are also rejected part-way (keeping a
wrong recurrent state on commit makes this test fail).
"""

from __future__ import annotations

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import (
    HYBRID_FAMILIES,
    damp_outputs,
    make_tiny_hybrid_model,
    make_tiny_hybrid_model_with_mtp,
)
from worker.drafters.oracle import OracleDrafter, greedy_reference
from worker.drafters.picker import SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model

GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)
PREFILL_CHUNK = 7
DAMPING = 0.07  # on o_proj, out_proj, down_proj: loops with mixed acceptance for both families


@pytest.fixture(scope="module", params=sorted(HYBRID_FAMILIES))
def model(request, tmp_path_factory) -> LoadedModel:
    folder = make_tiny_hybrid_model(tmp_path_factory.mktemp(request.param), request.param, tie_word_embeddings=True)
    model = load_model(folder, dtype="float64")
    damp_outputs(model.decoder, DAMPING)
    return model


def _repeating_prompts(vocab_size: int) -> list[list[int]]:
    """Prompts that repeat themselves, so prompt lookup finds continuations the target agrees with."""
    generator = torch.Generator().manual_seed(5)
    prompts = []
    for length, copies in ((2, 12), (3, 10), (4, 8), (5, 6), (7, 4), (3, 6)):
        block = torch.randint(3, vocab_size, (length,), generator=generator).tolist()
        prompts.append(block * copies)
    return prompts


def _run(runner: ModelRunner, prompt: list[int]) -> tuple[list[int], SpecStats]:
    sequence = runner.start("spec", prompt, GREEDY)
    while sequence.num_to_prefill:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        runner.decode_step(sequence)
    return sequence.output_ids, sequence.stats


@pytest.mark.parametrize("mode", ["ngram", "suffix"])  # chains; suffix decoding's trees of several paths
def test_lookup_speculation_gives_plain_greedy_tokens(model, mode):
    eos = model.checkpoint.eos_token_ids
    plain = ModelRunner(model.decoder, eos)
    lookup = ModelRunner(model.decoder, eos, load_drafter(mode, model, DraftOptions()))
    num_accepted = num_drafted = 0
    for prompt in _repeating_prompts(model.config.vocab_size):
        expected, _ = _run(plain, prompt)
        speculated, stats = _run(lookup, prompt)
        assert speculated == expected
        num_accepted, num_drafted = num_accepted + stats.accepted_tokens, num_drafted + stats.draft_tokens
    # drafts were accepted, and some rejected part-way: recurrent state was committed after inner rows
    assert 0 < num_accepted < num_drafted


@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_the_default_mode_drafts_from_the_head_with_one_and_from_suffixes_without(tmp_path, family):
    """Qwen3.5 and Qwen3-Next checkpoints ship `mtp.*` tensors: their head is the default's model drafter."""
    with_head = load_model(make_tiny_hybrid_model_with_mtp(tmp_path / "with-mtp", family))
    without = load_model(make_tiny_hybrid_model(tmp_path / "without", family))
    picker = load_drafter("auto", with_head, DraftOptions())
    assert isinstance(picker, SourcePicker) and picker.model is not None and picker.model.name == "mtp"
    alone = load_drafter("auto", without, DraftOptions())
    assert isinstance(alone, SourcePicker) and alone.model is None


def test_tree_verification_through_the_runner_gives_plain_greedy_tokens(model):
    """An oracle tree (the right token and a wrong sibling at each depth): every step commits a
    path that skips rows, so K/V move and each recurrent layer keeps a state from a tree node."""
    prompt = _repeating_prompts(model.config.vocab_size)[1]
    reference = greedy_reference(model.decoder, prompt, GREEDY.max_tokens)
    drafter = OracleDrafter(reference, depth=3, vocab_size=model.config.vocab_size, num_wrong_siblings=1)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    output, stats = _run(runner, prompt)
    assert output == reference[len(prompt) :]
    assert stats.accepted_tokens == 3 * stats.drafts > 0  # every correct node accepted, every sibling not
