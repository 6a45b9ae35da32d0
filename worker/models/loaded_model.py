"""What loading a model gives the rest of the worker: the decoder, its checkpoint's text side and
the tensors it does not own. Below both loaders (worker/models/loader.py and hybrid/loader.py)."""

from __future__ import annotations

from dataclasses import dataclass

import tokenizers
import torch

from worker.models.checkpoint import Checkpoint
from worker.models.config import ModelConfig
from worker.models.decoder import Decoder
from worker.models.weight_formats import LinearFormats

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(slots=True)
class LoadedModel:
    name: str
    decoder: Decoder  # or a HybridDecoder: the same forward and cache contract (worker/models/hybrid/)
    checkpoint: Checkpoint  # tensors dropped after loading, except extras such as `mtp.*`
    extra_tensors: dict[str, torch.Tensor]  # checkpoint tensors the decoder does not own (e.g. an MTP head)
    formats: LinearFormats | None = None  # the linears' weight formats (None: built by hand)

    @property
    def config(self) -> ModelConfig:
        return self.decoder.config

    @property
    def tokenizer(self) -> tokenizers.Tokenizer:
        return self.checkpoint.tokenizer
