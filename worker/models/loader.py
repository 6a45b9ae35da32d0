"""Load any supported model path into a ready decoder plus its text side."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from shared.settings import DEFAULT_MODEL_NAME, served_model_name
from worker.kernels.fused_layers import FusedLayers, fusable
from worker.kernels.native_lib import kernel_choice, load_kernels
from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.config import ModelConfig
from worker.models.decoder import Decoder
from worker.models.fast_weights import LinearSource, build_fast_linears
from worker.models.hybrid.config import is_hybrid
from worker.models.loaded_model import DTYPES, LoadedModel
from worker.models.refined_head import TopKRefinedHead
from worker.models.weight_formats import LinearFormats, linear_formats

logger = logging.getLogger(__name__)


def read_checkpoint(path: str | Path | None, cache_dir: Path | None = None, keep_quantized: bool = False) -> Checkpoint:
    """`cache_dir` keeps converted GGUF weights (a 5 s conversion becomes a 0.1 s read);
    `keep_quantized` leaves a GGUF's quantized tensors in `Checkpoint.quantized`."""
    if path is None:
        from worker.models.default_model import default_model_path

        path = default_model_path()
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"model path {path} does not exist")
    if path.is_dir():
        from worker.models.hf_loader import load_hf_checkpoint

        return load_hf_checkpoint(path)
    if path.suffix == ".gguf":
        from worker.models.gguf_loader import load_gguf_checkpoint

        return load_gguf_checkpoint(path, cache_dir, keep_quantized)
    raise CheckpointError(f"model path {path} is neither a Hugging Face folder nor a .gguf file")


def load_model(
    path: str | Path | None = None,
    dtype: str | torch.dtype = torch.float32,
    device: str = "cpu",
    cache_dir: Path | None = None,
    quantize: str = "auto",
    kernels: str = "auto",
    kernel_isa: str = "auto",
) -> LoadedModel:
    """`dtype` is the activation dtype ("auto": weight_formats.py); `quantize` the linears' format.

    An explicit float dtype with quantize "auto" is the exact path. Otherwise each linear is held
    in the one format weight_formats.linear_formats' rule gives, and every forward runs in it:
    timing never decides the numbers a request's tokens come from. `kernels` (auto|native|torch)
    says who multiplies quantized weights on a CPU and `kernel_isa` (auto or a path) which native path
    (worker/kernels/cpu_features.py).
    """
    dtype_name = _dtype_name(dtype)
    checkpoint = read_checkpoint(path, cache_dir, keep_quantized=True)
    device_type = torch.device(device).type
    choice = kernel_choice(kernels, kernel_isa) if device_type == "cpu" else None
    native_isa = choice.isa if choice is not None and choice.kernels == "native" else None
    activations = choice.activations if choice is not None else "int16"
    formats = linear_formats(quantize, dtype_name, device_type, checkpoint.quantization, native_isa, activations)
    if is_hybrid(checkpoint.config):  # Qwen3.5 / Qwen3-Next: worker/models/hybrid/
        from worker.models.hybrid.loader import load_hybrid_model

        return load_hybrid_model(checkpoint, _model_name(path, checkpoint.source), formats, dtype_name, device)
    config = ModelConfig.from_hf(checkpoint.config)
    if formats.is_exact_path:
        checkpoint = checkpoint.dequantized()
        decoder = build_decoder(config, checkpoint.tensors, DTYPES[formats.activation_dtype], device)
    else:
        decoder = build_fast_decoder(config, checkpoint, formats, device)
    logger.info("weight format: %s", formats.describe())
    owned = _decoder_tensor_names(config) | set(checkpoint.quantized)
    extras = {name: tensor for name, tensor in checkpoint.tensors.items() if name not in owned}
    checkpoint.tensors, checkpoint.quantized = {}, {}
    name = _model_name(path, checkpoint.source)
    return LoadedModel(name=name, decoder=decoder, checkpoint=checkpoint, extra_tensors=extras, formats=formats)


def _decoder_tensor_names(config: ModelConfig) -> set[str]:
    with torch.device("meta"):
        return set(Decoder(config).state_dict())


def _dtype_name(dtype: str | torch.dtype) -> str:
    if isinstance(dtype, str):
        if dtype != "auto" and dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose from auto, {', '.join(DTYPES)}")
        return dtype
    return next(name for name, value in DTYPES.items() if value == dtype)


def _model_name(path: str | Path | None, source: str) -> str:
    return DEFAULT_MODEL_NAME if path is None else served_model_name(source)


def build_decoder(
    config: ModelConfig, tensors: dict[str, torch.Tensor], dtype: torch.dtype, device: str = "cpu"
) -> Decoder:
    with torch.device("meta"):
        decoder = Decoder(config)
    expected = decoder.state_dict()
    missing = [name for name in expected if name not in tensors and not _tied(config, name)]
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensors, first: {missing[0]}")
    state = {}
    for name, meta in expected.items():
        tensor = tensors.get(name)
        if tensor is None:  # tied lm_head
            tensor = tensors["model.embed_tokens.weight"]
        if tuple(tensor.shape) != tuple(meta.shape):
            raise CheckpointError(f"tensor {name} has shape {tuple(tensor.shape)}, config expects {tuple(meta.shape)}")
        state[name] = tensor.to(device=device, dtype=dtype)
    decoder.load_state_dict(state, assign=True)
    if config.tie_word_embeddings:
        decoder.lm_head.weight = decoder.model.embed_tokens.weight
    return decoder.eval()


def build_fast_decoder(
    config: ModelConfig, checkpoint: Checkpoint, formats: LinearFormats, device: str = "cpu", fuse: bool = True
) -> Decoder:
    """The decoder with its linears in `formats` (fast_weights.py) and the rest dense in the activation dtype."""
    with torch.device("meta"):
        decoder = Decoder(config)
    dtype = DTYPES[formats.activation_dtype]
    linear_paths = [name.removesuffix(".weight") for name, module in _linear_weights(decoder)]
    sources = {path: _linear_source(checkpoint, config, path) for path in linear_paths}
    build_fast_linears(decoder, sources, formats, device, fuse)
    rest = {name: meta for name, meta in decoder.state_dict().items() if meta.is_meta}
    state = {name: _dense_tensor(checkpoint, config, name, meta, dtype, device) for name, meta in rest.items()}
    decoder.load_state_dict(state, assign=True, strict=False)
    decoder.activation_dtype = dtype
    if config.tie_word_embeddings and isinstance(decoder.lm_head, TopKRefinedHead):
        decoder.lm_head.weight = decoder.model.embed_tokens.weight  # one copy of the exact values, not two
    decoder.fused = _fused_layers(decoder, formats, fuse)
    return decoder.eval()


def _fused_layers(decoder: Decoder, formats: LinearFormats, fuse: bool) -> FusedLayers | None:
    """Every layer in one native call, where the kernels are native and the shapes fit (fused_layers.py)."""
    if formats.kernels != "native" or not fuse or formats.activation_dtype != "float32" or decoder.config.mlp_bias:
        return None
    kernels = load_kernels(formats.native_isa or "portable")
    if not fusable(decoder.config, kernels):
        return None
    two_term = formats.native_activations == "int16"
    return FusedLayers(decoder, kernels, formats.formats.index(formats.body), two_term, torch.get_num_threads())


def _linear_weights(decoder: Decoder) -> list[tuple[str, nn.Module]]:
    return [(f"{path}.weight", module) for path, module in decoder.named_modules() if isinstance(module, nn.Linear)]


def _linear_source(checkpoint: Checkpoint, config: ModelConfig, path: str) -> LinearSource:
    name = f"{path}.weight"
    if _tied(config, name):
        name = "model.embed_tokens.weight"
    quantized = checkpoint.quantized.get(name)
    weight = quantized if quantized is not None else _checked(checkpoint.tensors, name)
    return LinearSource(weight, checkpoint.tensors.get(f"{path}.bias"))


def _dense_tensor(
    checkpoint: Checkpoint, config: ModelConfig, name: str, meta: torch.Tensor, dtype: torch.dtype, device: str
) -> torch.Tensor:
    weight = checkpoint.quantized.get(name)
    tensor = weight.dequantize() if weight is not None else _checked(checkpoint.tensors, name)
    if tuple(tensor.shape) != tuple(meta.shape):
        raise CheckpointError(f"tensor {name} has shape {tuple(tensor.shape)}, config expects {tuple(meta.shape)}")
    return tensor.to(device=device, dtype=dtype)


def _checked(tensors: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    if name not in tensors:
        raise CheckpointError(f"checkpoint is missing tensor {name}")
    return tensors[name]


def _tied(config: ModelConfig, name: str) -> bool:
    return config.tie_word_embeddings and name == "lm_head.weight"
