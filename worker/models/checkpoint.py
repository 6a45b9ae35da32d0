"""What every checkpoint loader returns: weights under Hugging Face names plus the text side.

The HF-folder loader and the GGUF loader both produce a `Checkpoint`, so the decoder, the
tokenizer wrapper and the chat template never need to know which file format a model came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import tokenizers
import torch

from worker.kernels.quantized_weight import QuantizedWeight


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
    # tensors a file holds quantized (GGUF Q4_0/Q4_1/Q8_0), kept so; their names are not in `tensors`
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)

    def dequantized(self) -> Checkpoint:
        """The same checkpoint with every quantized tensor dequantized to float32 into `tensors`."""
        dense = {name: weight.dequantize() for name, weight in self.quantized.items()}
        return replace(self, tensors={**self.tensors, **dense}, quantized={})

    @property
    def quantization(self) -> str | None:
        """'int4' if the linear layers are held in int4, 'int8' if in int8, None if float."""
        kinds = {type(weight).__name__ for name, weight in self.quantized.items() if ".layers." in name}
        return {"Int4Weight": "int4", "Int8Weight": "int8"}.get(kinds.pop()) if len(kinds) == 1 else None
