"""A decoder's linear layers in their chosen weight format, with q/k/v and gate/up fused.

`build_fast_linears` replaces every `Linear` of a (meta-built) decoder by a `PlannedLinear`
holding the one format weight_formats.py's rule chose, made from the checkpoint's weight as it
is: a GGUF Q4 tensor becomes int4 without a float detour, a float tensor is quantized here. The
exact path (dense in the activation dtype) never comes here: the loader keeps the plain
`Linear`s for it, unfused.

The same rule serves the hybrid decoder (hybrid/hybrid_linears.py: its linears one by one, through
`planned_linear` and `head_in_format`) and the drafters' layers (`linears_in_format`): one format
for every big linear of a served model, whatever module holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from worker.kernels.native_lib import load_kernels
from worker.kernels.native_linear import NativeQuantizedLinear
from worker.kernels.quantized_weight import (
    INT4_GROUP_SIZE,
    Int4Weight,
    Int8Weight,
    QuantizedWeight,
    concat_rows,
    dequantized,
    quantize_int4,
    quantize_int8,
)
from worker.models.decoder import MLP, Attention, Decoder, DecoderLayer
from worker.models.linear import Linear
from worker.models.planned_linear import PlannedLinear
from worker.models.quantized_linear import QuantizedLinear
from worker.models.refined_head import TopKRefinedHead
from worker.models.weight_formats import QUANTIZED_FORMATS, LinearFormats, WeightFormat

SourceWeight = torch.Tensor | QuantizedWeight  # [out, in] dense, or as the file quantized it
DENSE_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(slots=True)
class LinearSource:
    weight: SourceWeight
    bias: torch.Tensor | None  # [out]


def build_fast_linears(
    decoder: Decoder,
    sources: dict[str, LinearSource],
    formats: LinearFormats,
    device: torch.device | str,
    fuse: bool = True,
) -> None:
    """Install every linear of `decoder` from `sources` (keyed by module path, "model.layers.0.mlp.up_proj").
    `fuse` False keeps the seven projections apart (ops/bench/fusions.py measures the difference)."""
    for layer_index, layer in enumerate(decoder.model.layers):
        assert isinstance(layer, DecoderLayer)
        prefix = f"model.layers.{layer_index}"
        if fuse:
            _fuse_attention(layer.self_attn, sources, f"{prefix}.self_attn", formats, device)
            _fuse_mlp(layer.mlp, sources, f"{prefix}.mlp", formats, device)
        else:
            _install_apart(layer, sources, prefix, formats, device)
    decoder.lm_head = head_in_format(sources["lm_head"], formats, device)


def head_in_format(source: LinearSource, formats: LinearFormats, device: torch.device | str) -> nn.Module:
    """The lm_head in `formats.head`; a quantized one keeps its unpacked weight (a drafter's subset
    selects its rows) and is refined from the exact weight where the rule says so."""
    head = planned_linear(source, formats.head, formats, device)
    if formats.head in QUANTIZED_FORMATS:
        head.source = _in_format(source.weight, formats.head)  # type: ignore[assignment]
    return _refined(head, source, formats, device) if formats.refine_head else head


def quantizable(linear: nn.Linear) -> bool:
    """int4 and int8 hold blocks of 32 along the input: a linear whose input is not a multiple of
    32 wide stays dense in the activation dtype (its product is small: a few heads' values)."""
    return linear.in_features % INT4_GROUP_SIZE == 0


def linears_in_format(module: nn.Module, formats: LinearFormats, device: torch.device | str) -> nn.Module:
    """`module` (loaded, dense: a drafter's layers) with every quantizable `nn.Linear` replaced by a
    PlannedLinear in the body's format, made from its weight as it is now (nothing, on the exact path)."""
    if formats.body not in QUANTIZED_FORMATS:
        return module
    for path, child in list(module.named_modules()):
        if isinstance(child, nn.Linear) and quantizable(child):
            bias = None if child.bias is None else child.bias.detach()
            source = LinearSource(child.weight.detach().float(), bias)
            parent, _, name = path.rpartition(".")
            setattr(module.get_submodule(parent), name, planned_linear(source, formats.body, formats, device))
    return module


def _refined(
    head: PlannedLinear, source: LinearSource, formats: LinearFormats, device: torch.device | str
) -> TopKRefinedHead:
    """The head with its best candidates recomputed from the exact weight (refined_head.py)."""
    exact = dequantized(source.weight).to(device=device, dtype=DENSE_DTYPES[formats.activation_dtype])
    return TopKRefinedHead(head, exact)


def _fuse_attention(
    attn: Attention, sources: dict[str, LinearSource], prefix: str, formats: LinearFormats, device: torch.device | str
) -> None:
    parts = [sources[f"{prefix}.{name}"] for name in ("q_proj", "k_proj", "v_proj")]
    attn.qkv_proj = planned_linear(stack_rows(parts), formats.body, formats, device)
    del attn.q_proj, attn.k_proj, attn.v_proj
    attn.o_proj = planned_linear(sources[f"{prefix}.o_proj"], formats.body, formats, device)


def _fuse_mlp(
    mlp: MLP, sources: dict[str, LinearSource], prefix: str, formats: LinearFormats, device: torch.device | str
) -> None:
    parts = [sources[f"{prefix}.{name}"] for name in ("gate_proj", "up_proj")]
    mlp.gate_up_proj = planned_linear(stack_rows(parts), formats.body, formats, device)
    del mlp.gate_proj, mlp.up_proj
    mlp.down_proj = planned_linear(sources[f"{prefix}.down_proj"], formats.body, formats, device)


def _install_apart(
    layer: DecoderLayer,
    sources: dict[str, LinearSource],
    prefix: str,
    formats: LinearFormats,
    device: torch.device | str,
) -> None:
    for owner, names in ((layer.self_attn, ("q_proj", "k_proj", "v_proj", "o_proj")), (layer.mlp, LINEAR_MLP)):
        part = "self_attn" if owner is layer.self_attn else "mlp"
        for name in names:
            setattr(owner, name, planned_linear(sources[f"{prefix}.{part}.{name}"], formats.body, formats, device))


LINEAR_MLP = ("gate_proj", "up_proj", "down_proj")


def stack_rows(parts: list[LinearSource]) -> LinearSource:
    """One source whose rows are the parts' rows in order; quantized parts stay quantized if they can."""
    weights = [part.weight for part in parts]
    stacked: SourceWeight | None = None
    if not any(isinstance(w, torch.Tensor) for w in weights):
        stacked = concat_rows([w for w in weights if not isinstance(w, torch.Tensor)])
    if stacked is None:
        stacked = torch.cat([dequantized(w) for w in weights])
    biases = [part.bias for part in parts]
    if all(b is None for b in biases):
        return LinearSource(stacked, None)
    filled = [
        b if b is not None else torch.zeros(dequantized(w).shape[0]) for b, w in zip(biases, weights, strict=True)
    ]
    return LinearSource(stacked, torch.cat(filled))


def planned_linear(
    source: LinearSource, weight_format: WeightFormat, formats: LinearFormats, device: torch.device | str
) -> PlannedLinear:
    """A layer holding the source's weight in `weight_format`, and nothing else."""
    out_features, in_features = source.weight.shape
    module = format_module(_in_format(source.weight, weight_format), source.bias, weight_format, formats, device)
    return PlannedLinear(module, weight_format, in_features, out_features)


def format_module(
    weight: SourceWeight,
    bias: torch.Tensor | None,
    weight_format: WeightFormat,
    formats: LinearFormats,
    device: torch.device | str,
) -> nn.Module:
    if weight_format in QUANTIZED_FORMATS:
        assert not isinstance(weight, torch.Tensor), "quantize before packing"
        activation = DENSE_DTYPES[formats.activation_dtype]
        bias = None if bias is None else bias.to(activation)
        if formats.kernels == "native":
            kernels = load_kernels(formats.native_isa or "portable")
            two_term = formats.native_activations == "int16"
            return NativeQuantizedLinear(weight, bias, kernels, torch.get_num_threads(), two_term)  # packing rounds
        return QuantizedLinear(weight, bias, device)
    return dense_linear(dequantized(weight), bias, DENSE_DTYPES[weight_format], device)


def dense_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype, device: torch.device | str
) -> Linear:
    out_features, in_features = weight.shape
    with torch.device("meta"):
        linear = Linear(in_features, out_features, bias=bias is not None)
    linear.weight = nn.Parameter(weight.to(device=device, dtype=dtype), requires_grad=False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.to(device=device, dtype=dtype), requires_grad=False)
    return linear


def _in_format(weight: SourceWeight, weight_format: WeightFormat) -> SourceWeight:
    """The weight a `weight_format` module is built from: kept if it already is one, else converted."""
    if weight_format == "int4":
        return weight if isinstance(weight, Int4Weight) else quantize_int4(dequantized(weight))
    if weight_format == "int8":
        return weight if isinstance(weight, Int8Weight) else quantize_int8(dequantized(weight))
    return weight
