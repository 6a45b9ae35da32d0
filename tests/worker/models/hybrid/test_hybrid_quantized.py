"""Hybrid models quantized at load (int4, int8) on the native kernels, against transformers.

The oracle for a quantized model is transformers running the same checkpoint with each quantized
weight replaced by its dequantized values, as the native kernels hold them (scales in fp16,
packing.as_native_sees; a quantized linear is a dense linear over those, up to
the kernels' rounding of the activations); the lm_head stays exact in both (refined_head.py keeps
the best candidates exact). Every big linear must be quantized: a set of tensors left dense that
the rule says quantize fails here. Held bytes: the one copy of each format the rule chose.

Shapes: the tiny hybrids' value width (4 heads x 12) and shared expert (48) are not multiples of
32, which int4/int8 blocks need; here they are 16 and 64 so that every big linear is quantizable.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from shared.sampling import SamplingParams
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from worker.engine.runner import ModelRunner
from worker.kernels.native_linear import NativeQuantizedLinear
from worker.kernels.packing import as_native_sees
from worker.kernels.quantized_weight import quantize_int4, quantize_int8
from worker.models.held_bytes import held_tensor_bytes
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.loader import LoadedModel, load_model
from worker.models.planned_linear import PlannedLinear
from worker.models.refined_head import TopKRefinedHead

QUANTIZABLE_SHAPES = dict(linear_value_head_dim=16, shared_expert_intermediate_size=64)
CASES = {
    "qwen3_5_text": dict(family="qwen3_5_text"),
    "qwen3_5_text-tied": dict(family="qwen3_5_text", tie_word_embeddings=True),
    "qwen3_next": dict(family="qwen3_next"),  # sparse layers with one dense (mlp_only) layer
    "qwen3_next-dense": dict(family="qwen3_next", mlp_only_layers=[0, 1, 2, 3]),
}
# Checkpoint tensors kept dense whatever the format: the router, the shared expert's one-output
# gate, the depthwise conv (and 1-D norms, biases, A_log, dt_bias: not matrices)
DENSE_MATRICES = ("mlp.gate.weight", "shared_expert_gate.weight", "conv1d.weight")
QUANTIZERS = {"int4": quantize_int4, "int8": quantize_int8}
NUM_TOKENS = 80


@functools.cache
def checkpoint(case: str, root: Path) -> Path:
    options = dict(CASES[case])
    family = options.pop("family")
    return make_tiny_hybrid_model(root / case, family, **QUANTIZABLE_SHAPES, **options)


def body_matrices(folder: Path) -> set[str]:
    """The checkpoint's layer matrices the rule quantizes: every 2-D `model.layers.*` weight but
    the router, the gates of one output and the conv."""
    tensors = load_file(str(folder / "model.safetensors"))
    return {
        name
        for name, tensor in tensors.items()
        if name.startswith("model.layers.") and tensor.dim() == 2 and not name.endswith(DENSE_MATRICES)
    }


def dequantized_oracle(folder: Path, weight_format: str) -> transformers.PreTrainedModel:
    """transformers over `folder` with the body's matrices replaced by their quantized values."""
    oracle = folder.parent / f"{folder.name}-{weight_format}-oracle"
    if not oracle.exists():
        shutil.copytree(folder, oracle)
        path = str(oracle / "model.safetensors")
        tensors = load_file(path)
        quantize = QUANTIZERS[weight_format]
        for name in body_matrices(folder):
            native = as_native_sees(quantize(tensors[name].float()))  # scales as the kernels hold them
            tensors[name] = native.dequantize().to(tensors[name].dtype)
        save_file(tensors, path, metadata={"format": "pt"})
    return transformers.AutoModelForCausalLM.from_pretrained(oracle, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quantized-hybrids")


@pytest.fixture(scope="module", params=[(case, fmt) for case in sorted(CASES) for fmt in ("int4", "int8")], ids=str)
def quantized_pair(request, root) -> tuple[LoadedModel, transformers.PreTrainedModel, Path, str]:
    case, weight_format = request.param
    folder = checkpoint(case, root)
    ours = load_model(folder, dtype="auto", quantize=weight_format, kernels="native")
    return ours, dequantized_oracle(folder, weight_format), folder, weight_format


def _planned_paths(decoder: torch.nn.Module) -> dict[str, PlannedLinear]:
    return {path: m for path, m in decoder.named_modules() if isinstance(m, PlannedLinear)}


def test_every_big_linear_is_held_in_the_chosen_format_on_the_native_kernels(quantized_pair):
    ours, _, folder, weight_format = quantized_pair
    decoder = ours.decoder
    assert isinstance(decoder, HybridDecoder)
    assert ours.formats is not None and ours.formats.body == weight_format and ours.formats.kernels == "native"
    planned = _planned_paths(decoder)
    body = {f"{path}.weight" for path in planned if path.startswith("model.layers.")}
    assert body == body_matrices(folder)
    for linear in planned.values():
        assert linear.weight_format == weight_format
        assert isinstance(linear.module, NativeQuantizedLinear)
    assert isinstance(decoder.lm_head, TopKRefinedHead) and decoder.lm_head.head.weight_format == weight_format
    assert decoder.dtype == torch.float32 and decoder.model.embed_tokens.weight.dtype == torch.float32
    assert ours.extra_tensors == {}  # every tensor has its owner, quantized ones included


def test_logits_match_transformers_over_dequantized_weights(quantized_pair):
    """One forward over 80 tokens (the chunked delta rule, past a 64-token chunk): the logits of
    each row's best tokens (refined: exact head) are the oracle's within the kernels' rounding of
    the activations (two int8 terms: ~1e-4 of a value, grown through the layers)."""
    ours, oracle, _, _ = quantized_pair
    token_ids = torch.randint(0, ours.config.vocab_size, (NUM_TOKENS,), generator=torch.Generator().manual_seed(1))
    logits = ours.decoder(token_ids, torch.arange(NUM_TOKENS), ours.decoder.new_cache(128)).logits
    with torch.no_grad():
        expected = oracle(token_ids[None]).logits[0]
    best = expected.topk(8, dim=-1).indices
    error = (logits.gather(-1, best) - expected.gather(-1, best)).abs().max()
    assert error <= 2e-3 * expected.abs().max(), (error, expected.abs().max())


def test_greedy_run_through_the_runner_matches_transformers_over_dequantized_weights(quantized_pair):
    ours, oracle, _, _ = quantized_pair
    prompt = [5, 17, 42, 99, 7, 3, 11, 60, 2]
    with torch.no_grad():
        expected = oracle.generate(
            torch.tensor([prompt]),
            max_new_tokens=48,
            min_new_tokens=48,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )[0, len(prompt) :].tolist()
    runner = ModelRunner(ours.decoder, ours.checkpoint.eos_token_ids)
    sequence = runner.start("greedy", prompt, SamplingParams(max_tokens=48, ignore_eos=True))
    while sequence.num_to_prefill:
        runner.prefill(sequence, max_chunk=5)
    while not sequence.finished:
        runner.decode_step(sequence)
    assert sequence.output_ids == expected
    assert len(set(expected)) > 8  # a run that explores


def test_held_bytes_are_one_copy_of_each_format(quantized_pair):
    """The sum of the parts, each counted by its owner: dense parameters (embedding, norms, conv,
    router, gates), each native linear's packed weight, the head's kept source and, untied, the
    refined head's exact weight. A dense twin of any quantized linear would add to the held bytes.
    (A model as loaded: a forward adds its rotary tables.)"""
    _, _, folder, weight_format = quantized_pair
    ours = load_model(folder, dtype="auto", quantize=weight_format, kernels="native")
    decoder = ours.decoder
    head = decoder.lm_head
    assert isinstance(head, TopKRefinedHead) and head.head.source is not None
    dense = [*decoder.parameters(), head.weight]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in dense}
    packed = sum(m.packed.untyped_storage().nbytes() for m in decoder.modules() if isinstance(m, NativeQuantizedLinear))
    source = head.head.source
    kept = sum(
        t.untyped_storage().nbytes() for t in (source.q, source.scales, getattr(source, "mins", None)) if t is not None
    )
    assert held_tensor_bytes(decoder) == sum(storages.values()) + packed + kept
    dense_weights = [p for p in decoder.parameters() if p.dim() == 2 and p.shape[0] != ours.config.vocab_size]
    # no layer matrix the rule quantizes is held dense too: the dense 2-D parameters are the router,
    # the one-output gates and nothing of the body's size
    assert all(p.shape[0] in (1, ours.config.moe.num_experts if ours.config.moe else -1) for p in dense_weights), [
        tuple(p.shape) for p in dense_weights
    ]


def test_quantize_none_still_loads_the_exact_path(root):
    model = load_model(checkpoint("qwen3_5_text", root), dtype="auto", quantize="none")
    assert not _planned_paths(model.decoder)
    assert model.formats is not None and model.formats.is_exact_path
