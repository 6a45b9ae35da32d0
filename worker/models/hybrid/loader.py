"""A hybrid checkpoint (read by the HF loader, under its own tensor names) into a HybridDecoder.

Names are checked strictly: every tensor the decoder owns must be there with the config's shape.
A composite Qwen3.5 checkpoint keeps its text model under `model.language_model.*`; those names
are read as `model.*`, and vision tensors (`model.visual.*`) are refused by name. Tensors the
decoder does not own (Qwen3-Next's `mtp.*` head) stay in `extra_tensors`.
The weight formats follow the plain models' rule (weight_formats.py): the exact path is dense
weights in the activation dtype; int4/int8 put the big linears on the kernels (hybrid_linears.py).
"""

from __future__ import annotations

import logging
from typing import TypeVar

import torch

from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.hybrid.hybrid_linears import build_quantized_hybrid_decoder
from worker.models.loaded_model import DTYPES, LoadedModel
from worker.models.weight_formats import LinearFormats, linear_formats

logger = logging.getLogger(__name__)
_T = TypeVar("_T")
COMPOSITE_TEXT_PREFIX = "model.language_model."
VISION_PREFIXES = ("model.visual.", "visual.")


def load_hybrid_model(
    checkpoint: Checkpoint, name: str, formats: LinearFormats, dtype: str = "float32", device: str = "cpu"
) -> LoadedModel:
    """`formats` by weight_formats.linear_formats' rule; on the exact path the activation dtype is
    `dtype`, float32 for "auto" (the delta rule's state is only validated from float32 up)."""
    config = HybridConfig.from_hf(checkpoint.config)
    tensors = text_tensors(checkpoint.tensors)
    quantized = text_tensors(checkpoint.quantized)
    with torch.device("meta"):
        owned = set(HybridDecoder(config).state_dict())
    if formats.is_exact_path:
        dense = {**tensors, **{key: weight.dequantize() for key, weight in quantized.items()}}
        activation = "float32" if dtype == "auto" else dtype
        formats = linear_formats("none", activation, torch.device(device).type, None)  # what is built
        decoder = build_hybrid_decoder(config, dense, DTYPES[activation], device)
    else:
        activation = formats.activation_dtype
        decoder = build_quantized_hybrid_decoder(config, tensors, quantized, formats, DTYPES[activation], device)
    logger.info("weight format: %s", formats.describe())
    extras = {key: tensor for key, tensor in tensors.items() if key not in owned}
    checkpoint.tensors, checkpoint.quantized = {}, {}
    return LoadedModel(name=name, decoder=decoder, checkpoint=checkpoint, extra_tensors=extras, formats=formats)  # type: ignore[arg-type]


def text_tensors(tensors: dict[str, _T]) -> dict[str, _T]:
    """The text model's tensors under `model.*` names; a vision tower is refused by name."""
    vision = sorted(key for key in tensors if key.startswith(VISION_PREFIXES))
    if vision:
        raise CheckpointError(f"checkpoint has {len(vision)} vision tensors ({vision[0]}, ...): Arbor serves text only")
    return {_text_name(key): tensor for key, tensor in tensors.items()}


def _text_name(key: str) -> str:
    return "model." + key.removeprefix(COMPOSITE_TEXT_PREFIX) if key.startswith(COMPOSITE_TEXT_PREFIX) else key


def build_hybrid_decoder(
    config: HybridConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: str = "cpu"
) -> HybridDecoder:
    with torch.device("meta"):
        decoder = HybridDecoder(config)
    state = {}
    for key, meta in decoder.state_dict().items():
        tensor = tensors.get(key)
        if tensor is None and config.tie_word_embeddings and key == "lm_head.weight":
            tensor = tensors.get("model.embed_tokens.weight")
        if tensor is None:
            raise CheckpointError(f"checkpoint is missing tensor {key}")
        if tuple(tensor.shape) != tuple(meta.shape):
            raise CheckpointError(f"tensor {key} has shape {tuple(tensor.shape)}, config expects {tuple(meta.shape)}")
        state[key] = tensor.to(device=device, dtype=dtype)
    decoder.load_state_dict(state, assign=True)
    if config.tie_word_embeddings:
        decoder.lm_head.weight = decoder.model.embed_tokens.weight
    return decoder.eval()
