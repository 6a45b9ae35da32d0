"""Quantized hybrids stay lossless: on tiny Qwen3.5 and Qwen3-Next targets quantized at load
(int4 and int8 on the native kernels, float32 activations: the served `auto` format), every
speculation mode gives plain decoding's greedy tokens in the same format, token for token.

The oracle is `none` on the same decoder. The native linears compute each row on its own in a
fixed order, so a verification's rows are the bits a one-row step gives; a mode that commits the
wrong recurrent state, or a linear whose rows depended on their neighbours, fails here; so does
a lane whose tokens in a batch (through the scheduler and stepper) differ from the request alone.
Drafts are both accepted and rejected: the target is damped (test_hybrid_speculation.py says
why), so lookup drafts, the model's own MTP head (on the kernels beside a native target) and a
steered DFlash drafter (its layers in the target's format) are right some of the time.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from shared.sampling import SamplingParams
from tests.support.steered_dflash import SteeredDFlash
from tests.support.tiny_drafters import write_random_dflash
from tests.support.tiny_hybrid_models import HYBRID_FAMILIES, make_tiny_hybrid_model_with_mtp
from tests.worker.models.hybrid.test_hybrid_batched import MAX_LANES, run_batched
from tests.worker.models.hybrid.test_hybrid_quantized import QUANTIZABLE_SHAPES
from tests.worker.speculation.test_lossless import make_prompts
from worker.drafters.dflash import DFlashDrafter
from worker.drafters.oracle import OracleDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model
from worker.models.planned_linear import PlannedLinear

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
PREFILL_CHUNK = 7
NUM_PROMPTS = 4
DAMPING = 0.07  # o_proj, out_proj, down_proj: as test_hybrid_speculation damps them
TARGET_LAYER_IDS = (1, 2)  # a recurrent layer's output and the attention layer's
TREE_BUDGET = 8
FORMATS = ("int4", "int8")
LOOKUP_MODES = ("ngram", "suffix", "mtp")
DFLASH_MODES = ("dflash", "tree")


@functools.cache
def folders(family: str) -> tuple[Path, Path]:
    """A damped, tied target with its own MTP head, and a random DFlash drafter for it."""
    root = Path(tempfile.mkdtemp(prefix=f"arbor-quantized-hybrid-{family}-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    target = make_tiny_hybrid_model_with_mtp(root / "target", family, tie_word_embeddings=True, **QUANTIZABLE_SHAPES)
    damp_checkpoint(target, DAMPING)
    dflash = write_random_dflash(root / "dflash", target, target_layer_ids=TARGET_LAYER_IDS, num_layers=1)
    return target, dflash


def damp_checkpoint(folder: Path, damping: float) -> None:
    """tiny_hybrid_models.damp_outputs, on the file: a quantized target is built from it as it is."""
    path = str(folder / "model.safetensors")
    tensors = load_file(path)
    for name in tensors:
        if name.startswith("model.") and name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            tensors[name] = tensors[name] * damping
    save_file(tensors, path, metadata={"format": "pt"})


@functools.cache
def target(family: str, weight_format: str) -> LoadedModel:
    model = load_model(folders(family)[0], dtype="auto", quantize=weight_format, kernels="native")
    assert any(isinstance(m, PlannedLinear) for m in model.decoder.model.layers.modules())
    return model


def prompts(family: str) -> list[list[int]]:
    return make_prompts(target(family, "int4").config.vocab_size, NUM_PROMPTS, seed=3)


def repeating_prompts(vocab_size: int) -> list[list[int]]:
    from tests.worker.models.hybrid.test_hybrid_speculation import _repeating_prompts

    return _repeating_prompts(vocab_size)[:4]


def run(runner: ModelRunner, prompt: list[int], stats: SpecStats) -> list[int]:
    sequence = runner.start("quantized-hybrid", prompt, GREEDY)
    while sequence.num_to_prefill:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        runner.decode_step(sequence)
    stats.merge(sequence.stats)
    return sequence.output_ids


@functools.cache
def plain(family: str, weight_format: str, prompt: tuple[int, ...]) -> list[int]:
    model = target(family, weight_format)
    return run(ModelRunner(model.decoder, model.checkpoint.eos_token_ids), list(prompt), SpecStats())


def dflash_drafter(family: str, weight_format: str, mode: str) -> DFlashDrafter:
    options = DraftOptions(draft=folders(family)[1], tree_budget=TREE_BUDGET)
    drafter = load_drafter(mode, target(family, weight_format), options)
    assert isinstance(drafter, DFlashDrafter)
    assert {m.weight_format for m in drafter.model.modules() if isinstance(m, PlannedLinear)} == {"int8"}
    return drafter


def check_lossless(family: str, weight_format: str, drafter, prompts: list[list[int]]) -> SpecStats:
    model = target(family, weight_format)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    stats = SpecStats()
    for prompt in prompts:
        assert run(runner, prompt, stats) == plain(family, weight_format, tuple(prompt)), drafter.name
    return stats


@pytest.mark.parametrize("mode", LOOKUP_MODES)
@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_lookup_and_mtp_modes_give_plain_greedy_tokens(family, weight_format, mode):
    model = target(family, weight_format)
    drafter = load_drafter(mode, model, DraftOptions())
    stats = check_lossless(family, weight_format, drafter, repeating_prompts(model.config.vocab_size))
    assert stats.draft_tokens > 0
    if mode != "mtp":  # a random head's drafts are rarely right; lookup's on the damped loops are
        assert 0 < stats.accepted_tokens < stats.draft_tokens


@pytest.mark.parametrize("mode", DFLASH_MODES)
@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_dflash_modes_give_plain_greedy_tokens(family, weight_format, mode):
    drafter = dflash_drafter(family, weight_format, mode)
    check_lossless(family, weight_format, drafter, prompts(family))
    references = [prompt + plain(family, weight_format, tuple(prompt)) for prompt in prompts(family)]
    steered = SteeredDFlash(drafter, references, TREE_BUDGET if mode == "tree" else None)
    stats = check_lossless(family, weight_format, steered, prompts(family))
    assert 0 < stats.accepted_tokens < stats.draft_tokens


@pytest.mark.parametrize("weight_format", FORMATS)
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_tree_verification_gives_plain_greedy_tokens(family, weight_format):
    """An oracle tree (the right token and a wrong sibling at each depth): every step commits a
    path that skips rows, so each recurrent layer keeps a state from a tree node."""
    model = target(family, weight_format)
    prompt = repeating_prompts(model.config.vocab_size)[1]
    reference = prompt + plain(family, weight_format, tuple(prompt))
    drafter = OracleDrafter(reference, depth=3, vocab_size=model.config.vocab_size, num_wrong_siblings=1)
    stats = check_lossless(family, weight_format, drafter, [prompt])
    assert stats.accepted_tokens == 3 * stats.drafts > 0


@pytest.mark.parametrize("mode", ["none", "ngram", "dflash"])
@pytest.mark.parametrize("family", sorted(HYBRID_FAMILIES))
def test_a_batched_lane_emits_what_it_emits_alone_in_the_quantized_format(family, mode):
    model = target(family, "int4")
    drafter = dflash_drafter(family, "int4", mode) if mode == "dflash" else load_drafter(mode, model, DraftOptions())
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    prompts = make_prompts(model.config.vocab_size, 8, seed=7)
    lanes = [
        (f"lane-{i}", prompt, SamplingParams(max_tokens=8 + 3 * i, ignore_eos=True)) for i, prompt in enumerate(prompts)
    ]
    outputs, lanes_per_step, _ = run_batched(runner, lanes)
    assert max(lanes_per_step) == MAX_LANES, "lanes did share steps"
    for name, prompt, params in lanes:
        assert outputs[name] == plain(family, "int4", tuple(prompt))[: params.max_tokens], name
