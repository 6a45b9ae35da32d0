"""A decoder in fast formats (fused q/k/v and gate/up, quantized or cast linears) against the exact path.

The oracle is the exact decoder (float32, unfused) built from the very weight values the fast one
holds: the kernel's dequantized weights. Only rounding may differ: the bfloat16 kernels' inputs
and outputs (logits within a few bfloat16 steps). A GGUF file's Q4/Q8 tensors load quantized with
the q/k permutation applied to whole rows, and round-trip the conversion cache unchanged.
"""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import pytest
import torch

from tests.support.tiny_models import make_tiny_model
from tests.worker.models.test_gguf_loader import write_tiny_gguf
from worker.kernels.quantized_weight import Int4Weight, Int8Weight, quantize_int4, quantize_int8
from worker.models.config import ModelConfig
from worker.models.gguf_loader import load_gguf_checkpoint
from worker.models.loader import build_decoder, build_fast_decoder, load_model, read_checkpoint
from worker.models.planned_linear import PlannedLinear
from worker.models.quantized_linear import QuantizedLinear
from worker.models.refined_head import TopKRefinedHead
from worker.models.weight_formats import LinearFormats
from worker.models.weight_packing import as_kernel_sees

Q = gguf.GGMLQuantizationType
PROMPT = [5, 17, 99, 3, 42, 250, 7, 7, 31, 64, 12]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@functools.cache
def tiny_folder(family: str) -> Path:
    import tempfile

    return make_tiny_model(Path(tempfile.mkdtemp(prefix=f"fast-{family}-")) / "model", family, seed=3)


def kernel_values(weight: torch.Tensor, kind: str) -> torch.Tensor:
    quantized = quantize_int4(weight) if kind == "int4" else quantize_int8(weight)
    return as_kernel_sees(quantized).dequantize()


def exact_decoder_with_values_of(folder: Path, kind: str):
    """The float32 exact-path decoder whose linear weights are what a `kind` kernel multiplies by."""
    checkpoint = read_checkpoint(folder)
    config = ModelConfig.from_hf(checkpoint.config)
    tensors = dict(checkpoint.tensors)
    for name, tensor in checkpoint.tensors.items():
        if name.endswith(".weight") and name.split(".")[-2] in LINEARS:  # lm_head: refined, so exact
            tensors[name] = kernel_values(tensor, kind) if kind != "bfloat16" else tensor.bfloat16().float()
    return build_decoder(config, tensors, torch.float32)


def logits(decoder, token_ids: list[int]) -> torch.Tensor:
    cache = decoder.new_cache(len(token_ids))
    return decoder(torch.tensor(token_ids), torch.arange(len(token_ids)), cache).logits  # [T, vocab]


@pytest.mark.parametrize("family", ["qwen3", "llama", "qwen2"])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_fast_decoder_matches_exact_decoder_on_the_same_values(family: str, kind: str) -> None:
    folder = tiny_folder(family)
    fast = load_model(folder, dtype="auto", quantize=kind, kernels="torch").decoder
    exact = exact_decoder_with_values_of(folder, kind)
    ours, expected = logits(fast, PROMPT), logits(exact, PROMPT)
    assert fast.model.layers[0].self_attn.qkv_proj is not None  # fused
    # the best candidates' logits are refined from the exact head: compare those
    best = expected.topk(4, dim=-1).indices  # [T, 4]
    scale = expected.abs().max().item()
    error = (ours.gather(-1, best) - expected.gather(-1, best)).abs().max().item()
    assert error < 0.06 * scale  # bfloat16 activations in the body's linears
    assert (ours.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.75  # random tiny models tie often


@pytest.mark.parametrize("kernels", ["torch", "native"])
def test_a_quantized_model_holds_each_linear_in_one_format_only(kernels: str) -> None:
    model = load_model(tiny_folder("qwen3"), dtype="auto", quantize="int4", kernels=kernels)
    planned = [module for module in model.decoder.modules() if isinstance(module, PlannedLinear)]
    assert planned and all(layer.weight_formats == ("int4",) for layer in planned)
    # no dense copy of a linear anywhere: the only float matrices are the embedding (the refined head's too)
    dense = [m for layer in planned for m in layer.modules() if isinstance(getattr(m, "weight", None), torch.Tensor)]
    assert dense == []


def test_explicit_float32_keeps_the_unfused_exact_path() -> None:
    decoder = load_model(tiny_folder("qwen3"), dtype="float32").decoder
    assert decoder.model.layers[0].self_attn.qkv_proj is None
    assert not any(isinstance(module, PlannedLinear) for module in decoder.modules())
    assert decoder.lm_head.weight.dtype == torch.float32


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_gguf_quantized_tensors_stay_quantized_in_hf_row_order(tmp_path: Path, qtype: Q) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", qtype=qtype)
    dense = load_gguf_checkpoint(tmp_path / "tiny.gguf")
    kept = load_gguf_checkpoint(tmp_path / "tiny.gguf", keep_quantized=True)
    expected_kind = Int8Weight if qtype == Q.Q8_0 else Int4Weight
    assert kept.quantized and all(isinstance(w, expected_kind) for w in kept.quantized.values())
    assert "model.layers.0.self_attn.q_proj.weight" in kept.quantized  # permuted rows, still quantized
    for name, weight in kept.quantized.items():
        assert torch.equal(weight.dequantize(), dense.tensors[name]), name
    assert set(kept.tensors) | set(kept.quantized) == set(dense.tensors)


def test_gguf_cache_round_trips_quantized_tensors(tmp_path: Path) -> None:
    path, cache_dir = tmp_path / "tiny.gguf", tmp_path / "cache"
    write_tiny_gguf(path, qtype=Q.Q4_1, qtype_overrides={"token_embd.weight": Q.Q8_0})
    fresh = load_gguf_checkpoint(path, cache_dir=cache_dir, keep_quantized=True)
    cached = load_gguf_checkpoint(path, cache_dir=cache_dir, keep_quantized=True)
    assert cached.quantized.keys() == fresh.quantized.keys() and cached.tensors.keys() == fresh.tensors.keys()
    for name, weight in fresh.quantized.items():
        again = cached.quantized[name]
        assert type(again) is type(weight) and again.group_size == weight.group_size, name
        assert torch.equal(again.dequantize(), weight.dequantize()), name
    dense_cached = load_gguf_checkpoint(path, cache_dir=cache_dir)
    assert all(torch.equal(dense_cached.tensors[n], w.dequantize()) for n, w in fresh.quantized.items())


# torch: bfloat16 activations, scales rounded to bfloat16; native: int8 activations per block of 32
# (measured on this tiny random model: 0.019 and 0.046 of the largest logit)
@pytest.mark.parametrize(("kernels", "tolerance"), [("torch", 0.03), ("native", 0.07)])
def test_q4_gguf_loads_into_int4_without_requantizing(tmp_path: Path, kernels: str, tolerance: float) -> None:
    write_tiny_gguf(tmp_path / "tiny.gguf", qtype=Q.Q4_1)
    model = load_model(tmp_path / "tiny.gguf", dtype="auto", kernels=kernels)
    assert model.formats is not None and model.formats.body == "int4"
    exact = load_model(tmp_path / "tiny.gguf", dtype="float32").decoder
    ours, expected = logits(model.decoder, PROMPT[:6]), logits(exact, PROMPT[:6])
    # the file's own int4 grid: close to its float32 model
    assert (ours - expected).abs().max().item() < tolerance * expected.abs().max().item()


def test_refined_head_is_exact_on_its_candidates_and_fast_elsewhere() -> None:
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(320, 64, generator=generator)
    int4 = quantize_int4(weight)
    fast = PlannedLinear(QuantizedLinear(int4, None, "cpu"), "int4", 64, 320)
    head = TopKRefinedHead(fast, weight, num_candidates=8)
    x = torch.randn(3, 64, generator=generator)
    ours, approximate, exact = head(x), fast(x), x @ weight.t()
    candidates = approximate.topk(8, dim=-1).indices
    assert torch.allclose(ours.gather(-1, candidates), exact.gather(-1, candidates), atol=1e-5)
    others = torch.ones_like(ours, dtype=torch.bool).scatter_(-1, candidates, False)
    assert torch.equal(ours[others], approximate[others])
    assert torch.equal(ours.argmax(-1), exact.argmax(-1))  # the true best is among the candidates here
    assert torch.allclose(head(x[1]), ours[1], atol=0.05)  # one hidden state, as a drafter passes it


def test_fused_and_apart_projections_compute_the_same_model() -> None:
    checkpoint = read_checkpoint(tiny_folder("llama"), keep_quantized=True)
    config = ModelConfig.from_hf(checkpoint.config)
    formats = LinearFormats("float32", "int4", "int4", refine_head=True)
    fused = build_fast_decoder(config, checkpoint, formats)
    apart = build_fast_decoder(config, checkpoint, formats, fuse=False)
    assert apart.model.layers[0].self_attn.qkv_proj is None and fused.model.layers[0].mlp.gate_up_proj is not None
    ours, expected = logits(fused, PROMPT), logits(apart, PROMPT)
    assert (ours - expected).abs().max().item() < 1e-2 * expected.abs().max().item()
