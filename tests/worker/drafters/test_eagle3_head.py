"""An EAGLE-3-style MTP head (fused low/middle/high target layers) loads in `mtp` and `auto` and is
lossless: greedy and seeded sampling emit plain decoding's very tokens, on tiny random targets in
float64 and in the served format (int4, the head int8, on the native kernels where the CPU has
them) with a random fused head (a separate folder on Qwen3 and Llama; embedded in a hybrid
Qwen3.5 / Qwen3-Next checkpoint). The drafter asks the target for exactly the layers it fuses,
and a head that names a layer the target lacks is refused."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import pytest

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread, write_random_eagle3
from tests.support.tiny_models import make_tiny_model
from tests.worker.speculation.test_lossless import assert_same_tokens, decode, make_prompts
from worker.drafters.mtp import MtpDrafter
from worker.drafters.picker import SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import DrafterError
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model
from worker.models.planned_linear import PlannedLinear

TARGET_LAYERS = (0, 2, 3)  # low, middle, high of a 4-layer target
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=40, ignore_eos=True, temperature=1.0, top_p=0.9, seed=11)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def folders(family: str) -> tuple[Path, Path]:
    root = Path(tempfile.mkdtemp(prefix=f"arbor-eagle3-{family}-"))
    target = make_tiny_model(root / "target", family, num_hidden_layers=4)
    return target, write_random_eagle3(root / "eagle3", target, TARGET_LAYERS)


@functools.cache
def loaded(family: str, served: bool = False) -> LoadedModel:
    if served:  # as the worker serves by default: int4 weights on the native kernels where it can
        return load_model(folders(family)[0], dtype="auto", quantize="int4")
    return load_model(folders(family)[0], dtype="float64")


def outputs(family: str, mode: str, params: SamplingParams, served: bool = False) -> tuple[list[list[int]], SpecStats]:
    model = loaded(family, served)
    drafter = load_drafter(mode, model, DraftOptions(draft=folders(family)[1]))
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    stats = SpecStats()
    prompts = make_prompts(model.config.vocab_size, 6, seed=4)
    return [decode(runner, prompt, params, stats) for prompt in prompts], stats


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("mode", ["mtp", "auto"])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_fused_layer_head_is_lossless(family, mode, params):
    expected, _ = outputs(family, "none", params)
    got, stats = outputs(family, mode, params)
    assert_same_tokens(expected, got, mode)
    assert stats.draft_tokens > 0, "nothing was drafted: the test would prove nothing"


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("mode", ["mtp", "mtp-tree", "auto"])
def test_fused_layer_head_is_lossless_in_the_served_format(mode, params):
    model = loaded("qwen3", served=True)
    assert model.formats is not None and model.formats.body == "int4"
    head = load_drafter("mtp", model, DraftOptions(draft=folders("qwen3")[1]))
    assert isinstance(head, MtpDrafter) and isinstance(head.head.target_fc, PlannedLinear)
    assert head.head.target_fc.weight_format == "int8"
    expected, _ = outputs("qwen3", "none", params, served=True)
    got, stats = outputs("qwen3", mode, params, served=True)
    assert_same_tokens(expected, got, mode)
    assert stats.draft_tokens > 0, "nothing was drafted: the test would prove nothing"


@pytest.mark.parametrize("mode", ["mtp", "auto"])
def test_the_drafter_reads_the_layers_it_fuses(mode):
    drafter = load_drafter(mode, loaded("qwen3"), DraftOptions(draft=folders("qwen3")[1]))
    assert drafter is not None
    head = drafter.model if isinstance(drafter, SourcePicker) else drafter
    assert isinstance(head, MtpDrafter) and head.hidden_source == "fused_layers"
    assert drafter.hidden_layers == TARGET_LAYERS
    assert not drafter.wants_final_hidden


def test_a_head_naming_a_layer_the_target_lacks_is_refused(tmp_path):
    target, _ = folders("qwen3")
    folder = write_random_eagle3(tmp_path / "bad", target, (0, 2, 4))
    with pytest.raises(DrafterError, match="mtp_target_layers"):
        load_drafter("mtp", loaded("qwen3"), DraftOptions(draft=folder))


@functools.cache
def hybrid_target(family: str) -> Path:
    """A tiny hybrid target whose embedded MTP head is made EAGLE-3-style: mtp.target_fc in its
    weights and mtp_target_layers in its config.json (an embedded head reads the target's config)."""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    from tests.support.tiny_hybrid_models import make_tiny_hybrid_model_with_mtp

    folder = make_tiny_hybrid_model_with_mtp(Path(tempfile.mkdtemp(prefix="arbor-eagle3-hybrid-")) / family, family)
    weights = folder / "model.safetensors"
    tensors = load_file(str(weights))
    hidden = tensors["mtp.norm.weight"].shape[0]
    generator = torch.Generator().manual_seed(5)
    tensors["mtp.target_fc.weight"] = 0.15 * torch.randn(hidden, len(TARGET_LAYERS) * hidden, generator=generator)
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["mtp_target_layers"] = list(TARGET_LAYERS)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("family", ["qwen3_next", "qwen3_5_text"])
def test_a_hybrid_targets_fused_layer_head_is_lossless(family):
    model = load_model(hybrid_target(family), dtype="float64")
    prompts = make_prompts(model.config.vocab_size, 4, seed=6)
    results = {}
    for mode in ("none", "mtp"):
        drafter = load_drafter(mode, model, DraftOptions())
        if mode == "mtp":
            assert isinstance(drafter, MtpDrafter) and drafter.hidden_layers == TARGET_LAYERS
        runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
        stats = SpecStats()
        results[mode] = ([decode(runner, prompt, GREEDY, stats) for prompt in prompts], stats)
    assert_same_tokens(results["none"][0], results["mtp"][0], "mtp")
    assert results["mtp"][1].draft_tokens > 0


def test_a_prefill_cache_hit_gives_the_fused_head_a_cold_runs_context():
    """The head's prefix snapshots hold its fused inputs: a warm lane drafts and emits what a cold one does."""
    from tests.worker.test_model_stepper import assert_same_drafter_context, chat, finish, prefill
    from worker.serving.model_stepper import ModelStepper
    from worker.serving.prefix_cache import PrefixCache
    from worker.serving_model import load_serving_model

    target, head = folders("qwen3")
    model = load_serving_model(target, "mtp", DraftOptions(draft=head))
    first, second = chat(model, "What is one plus one?"), chat(model, "Tell me about foxes, please.")
    params = SamplingParams(max_tokens=24)
    cold_stepper = ModelStepper(model.runner, None)
    cold = prefill(cold_stepper, second, params)
    stepper = ModelStepper(model.runner, PrefixCache(1 << 30, block_tokens=8))
    finish(stepper, prefill(stepper, first, params))
    warm = prefill(stepper, second, params)
    assert warm.prefix_tokens > 0
    assert_same_drafter_context("mtp", warm.sequence.drafter_state, cold.sequence.drafter_state, len(second) - 1)
    finish(stepper, warm), finish(cold_stepper, cold)
    assert warm.output_ids == cold.output_ids
    assert (warm.stats.drafts, warm.stats.accepted_tokens) == (cold.stats.drafts, cold.stats.accepted_tokens)


@pytest.mark.parametrize("mode", ["mtp", "auto"])
def test_batched_lanes_with_adaptive_draft_lengths_emit_what_each_emits_alone(mode):
    """Lanes share steps, and the load switches drafting off and on (a lane that does not draft
    defers its fused rows until it drafts again): each lane still emits plain decoding's tokens."""
    from tests.worker.engine.test_batched_engine import CountingStepper, run_batched
    from worker.serving.model_stepper import ModelStepper
    from worker.speculation.step_costs import StepCosts

    model = loaded("llama")
    drafter = load_drafter(mode, model, DraftOptions(draft=folders("llama")[1]))
    assert drafter is not None
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, drafter)
    max_draft = ModelStepper(runner)._decode_rows - 1
    seconds = {  # few lanes: drafting pays; many: it does not
        (lanes, k): 0.01 * lanes * (1 + k * (0.02 if lanes <= 2 else 0.5))
        for lanes in (1, 2, 8)
        for k in (0, 1, max_draft)
    }
    chosen: list[int] = []

    def make(runner_, pool):
        stepper = CountingStepper(runner_, pool=pool)
        stepper.chosen, stepper.step_costs = chosen, StepCosts(seconds)
        return stepper

    prompts = make_prompts(model.config.vocab_size, 10, seed=8)
    lanes = [
        (f"lane-{i}", prompt, SamplingParams(max_tokens=12 + 3 * i, ignore_eos=True))
        for i, prompt in enumerate(prompts)
    ]
    outputs, pool, _, _ = run_batched(runner, lanes, join_every=6, make_stepper=make)
    assert 0 in chosen and any(k > 0 for k in chosen), f"the load never switched the draft length: {chosen}"
    plain = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, None)
    for name, prompt, params in lanes:
        assert outputs[name] == decode(plain, prompt, params, SpecStats()), name
    assert pool.allocator.num_used == 0
