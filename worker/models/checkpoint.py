"""What every checkpoint loader returns: weights under Hugging Face names plus the text side.

The HF-folder loader and the GGUF loader both produce a `Checkpoint`, so the decoder, the
tokenizer wrapper and the chat template never need to know which file format a model came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tokenizers
import torch


class CheckpointError(ValueError):
    """A model path that cannot be served: missing file, unknown architecture or quantization."""


@dataclass(slots=True)
class Checkpoint:
    config: dict  # config.json-style dict: model_type, hidden_size, num_hidden_layers, rope_scaling, ...
    tensors: dict[str, torch.Tensor]  # HF names ("model.layers.0.self_attn.q_proj.weight", ...)
    tokenizer: tokenizers.Tokenizer
    chat_template: str | None
    eos_token_ids: list[int]
    bos_token_id: int | None = None
    add_bos_token: bool = False  # prepend BOS when encoding a raw prompt (chat templates add their own)
    special_tokens: dict[str, str] = field(default_factory=dict)  # bos_token, eos_token, ... for templates
    source: str = ""  # path it came from, for messages
