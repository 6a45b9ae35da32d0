"""Load any supported model path into a ready decoder plus its text side."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tokenizers
import torch

from shared.settings import DEFAULT_MODEL_NAME, served_model_name
from worker.models.checkpoint import Checkpoint, CheckpointError
from worker.models.config import ModelConfig
from worker.models.decoder import Decoder

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadedModel:
    name: str
    decoder: Decoder
    checkpoint: Checkpoint  # tensors dropped after loading, except extras such as `mtp.*`
    extra_tensors: dict[str, torch.Tensor]  # checkpoint tensors the decoder does not own (e.g. an MTP head)

    @property
    def config(self) -> ModelConfig:
        return self.decoder.config

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return self.checkpoint.tokenizer


def read_checkpoint(path: str | Path | None, cache_dir: Path | None = None) -> Checkpoint:
    """`cache_dir` keeps converted GGUF weights (a 5 s dequantization becomes a 0.1 s read)."""
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

        return load_gguf_checkpoint(path, cache_dir)
    raise CheckpointError(f"model path {path} is neither a Hugging Face folder nor a .gguf file")


def load_model(
    path: str | Path | None = None,
    dtype: str | torch.dtype = torch.float32,
    device: str = "cpu",
    cache_dir: Path | None = None,
) -> LoadedModel:
    checkpoint = read_checkpoint(path, cache_dir)
    dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    config = ModelConfig.from_hf(checkpoint.config)
    decoder = build_decoder(config, checkpoint.tensors, dtype, device)
    owned = set(decoder.state_dict())
    extras = {name: tensor for name, tensor in checkpoint.tensors.items() if name not in owned}
    checkpoint.tensors = {}
    name = _model_name(path, checkpoint.source)
    return LoadedModel(name=name, decoder=decoder, checkpoint=checkpoint, extra_tensors=extras)


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


def _tied(config: ModelConfig, name: str) -> bool:
    return config.tie_word_embeddings and name == "lm_head.weight"
