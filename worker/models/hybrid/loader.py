"""A hybrid checkpoint (read by the HF loader, under its own tensor names) into a HybridDecoder.

Names are checked strictly: every tensor the decoder owns must be there with the config's shape.
A composite Qwen3.5 checkpoint keeps its text model under `model.language_model.*`; those names
are read as `model.*`, and vision tensors (`model.visual.*`) are refused by name. Tensors the
decoder does not own (Qwen3-Next's `mtp.*` head) stay in `extra_tensors`.
Phase 1 serves the exact path only: dense weights in the activation dtype.
"""

from __future__ import annotations

import torch

from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.hybrid.config import HybridConfig
from worker.models.hybrid.decoder import HybridDecoder
from worker.models.loaded_model import DTYPES, LoadedModel

COMPOSITE_TEXT_PREFIX = "model.language_model."
VISION_PREFIXES = ("model.visual.", "visual.")


def load_hybrid_model(
    checkpoint: Checkpoint, name: str, dtype: str = "float32", device: str = "cpu", quantize: str = "auto"
) -> LoadedModel:
    if quantize not in ("auto", "none"):
        raise CheckpointError(f"quantize={quantize!r}: hybrid models are served unquantized for now (auto or none)")
    if checkpoint.quantized:
        raise CheckpointError("a quantized hybrid checkpoint is not served yet: use its safetensors weights")
    config = HybridConfig.from_hf(checkpoint.config)
    tensors = text_tensors(checkpoint.tensors)
    decoder = build_hybrid_decoder(config, tensors, DTYPES["float32" if dtype == "auto" else dtype], device)
    owned = set(decoder.state_dict())
    extras = {key: tensor for key, tensor in tensors.items() if key not in owned}
    checkpoint.tensors = {}
    return LoadedModel(name=name, decoder=decoder, checkpoint=checkpoint, extra_tensors=extras)  # type: ignore[arg-type]


def text_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
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
