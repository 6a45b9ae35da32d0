"""A hybrid decoder whose big linears are held in the one quantized format the rule chose.

weight_formats.py's rule, as for the plain decoder: with `--quantize int4/int8` (or a quantized
file) every big linear becomes a PlannedLinear in the body's format, on the native kernels where
they were chosen (fast_weights.planned_linear), made from the checkpoint's weight as it is:
  gated attention   q_proj (query and gate), k_proj, v_proj, o_proj
  gated DeltaNet    in_proj_qkvz + in_proj_ba (Qwen3-Next) or in_proj_qkv/z/b/a (Qwen3.5), out_proj
  MLPs              a dense layer's gate/up/down; each expert's and the shared expert's
The lm_head is the plain models' (fast_weights.head_in_format: the head's format, refined from
the exact weight); the embedding, the norms, the conv, the router and the shared expert's gate
(one output) stay dense in the activation dtype, as does a linear whose input is not a multiple
of 32 wide (fast_weights.quantizable). Experts stay separate: moe.SparseMoe runs each chosen
expert's linears over the rows routed to it, so a row's output never depends on its neighbours'.

Nothing is fused: the layers call their projections by name, and a row's numbers are the same
whichever way they are grouped. Each linear is built straight from its source, never from a
dense copy first: one copy of the weights (held_bytes.py).
"""

from __future__ import annotations

import torch
from torch import nn

from worker.kernels.quantized_weight import QuantizedWeight
from worker.models.checkpoint import CheckpointError
from worker.models.fast_weights import LinearSource, head_in_format, planned_linear, quantizable
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.refined_head import TopKRefinedHead
from worker.models.weight_formats import LinearFormats

# Kept dense whatever the format: a gate of one output per token, read beside the router.
DENSE_LINEARS = ("shared_expert_gate",)


def build_quantized_hybrid_decoder(
    config: HybridConfig,
    tensors: dict[str, torch.Tensor],
    quantized: dict[str, QuantizedWeight],
    formats: LinearFormats,
    dtype: torch.dtype,
    device: str = "cpu",
) -> HybridDecoder:
    """The decoder with its big linears in `formats` and the rest dense in `dtype` (the activation
    dtype). `quantized` holds tensors a file stored quantized (kept as they are), `tensors` the rest."""
    with torch.device("meta"):
        decoder = HybridDecoder(config)
    for path, linear in list(decoder.model.layers.named_modules(prefix="model.layers")):
        if isinstance(linear, nn.Linear) and quantizable(linear) and not path.endswith(DENSE_LINEARS):
            source = _source(path, (linear.out_features, linear.in_features), tensors, quantized)
            parent, _, name = path.rpartition(".")
            setattr(decoder.get_submodule(parent), name, planned_linear(source, formats.body, formats, device))
    head = "model.embed_tokens" if config.tie_word_embeddings else "lm_head"
    head_shape = (config.vocab_size, config.hidden_size)  # the tied embedding's too
    decoder.lm_head = head_in_format(_source(head, head_shape, tensors, quantized), formats, device)
    state = {}
    for name, meta in decoder.state_dict().items():
        if meta.is_meta:  # everything not installed above: embedding, norms, conv, router, small linears
            tensor = _dense(name, tensors, quantized)
            if tuple(tensor.shape) != tuple(meta.shape):
                raise CheckpointError(
                    f"tensor {name} has shape {tuple(tensor.shape)}, config expects {tuple(meta.shape)}"
                )
            state[name] = tensor.to(device=device, dtype=dtype)
    decoder.load_state_dict(state, assign=True, strict=False)
    if config.tie_word_embeddings and isinstance(decoder.lm_head, TopKRefinedHead):
        decoder.lm_head.weight = decoder.model.embed_tokens.weight  # one copy of the exact values, not two
    return decoder.eval()


def _source(
    path: str,
    expected: tuple[int, int],  # [out, in]
    tensors: dict[str, torch.Tensor],
    quantized: dict[str, QuantizedWeight],
) -> LinearSource:
    name = f"{path}.weight"
    weight: torch.Tensor | QuantizedWeight | None = quantized.get(name)
    if weight is None:
        weight = _checked(tensors, name)
    if tuple(weight.shape) != expected:
        raise CheckpointError(f"tensor {name} has shape {tuple(weight.shape)}, config expects {expected}")
    return LinearSource(weight, tensors.get(f"{path}.bias"))


def _dense(name: str, tensors: dict[str, torch.Tensor], quantized: dict[str, QuantizedWeight]) -> torch.Tensor:
    weight = quantized.get(name)
    return weight.dequantize() if weight is not None else _checked(tensors, name)


def _checked(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise CheckpointError(f"checkpoint is missing tensor {name}")
    return tensors[name]
