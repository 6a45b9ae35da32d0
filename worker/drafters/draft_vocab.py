"""A drafter's output vocabulary: the target's whole vocabulary, or the subset it learned to propose.

Why a subset: on a small target the output head dominates a draft step. SmolLM2-135M's lm_head is
49,152 x 576 (28M multiply-adds per row) while an MTP layer is ~3.5M, so three MTP steps over the
full vocabulary cost ~70 % of a target forward on a memory-bound CPU. Restricting drafting to the
tokens the target actually produces (the idea of FR-Spec, and EAGLE-3's `d2t` map) cuts that ~6x.
The output does not change: verification still runs the full target, so a token outside the
subset is merely never drafted, and the target emits it itself when it wants it.

On disk: an optional `draft_vocab.json` next to the drafter's config.json, {"token_ids": [...]}.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from worker.engine.drafter_protocol import DrafterError
from worker.kernels.native_linear import NativeQuantizedLinear, native_linear_of
from worker.kernels.quantized_weight import QuantizedWeight, quantize_int4, quantize_int8
from worker.models.planned_linear import PlannedLinear
from worker.models.quantized_linear import QuantizedLinear
from worker.models.refined_head import TopKRefinedHead

DRAFT_VOCAB_FILE = "draft_vocab.json"


class DraftVocabulary:
    """The head a drafter scores with. A target whose lm_head is held in fast formats
    (`PlannedLinear`) lends it as it is for the whole vocabulary; a subset is cut from its dense
    weight and, if the head is quantized, quantized the same way (drafts need not be exact)."""

    def __init__(self, lm_head: nn.Module, token_ids: torch.Tensor | None = None):
        self.token_ids = token_ids
        self.head: nn.Module | None = None  # a module computing the logits, else F.linear below
        if isinstance(lm_head, TopKRefinedHead):  # drafts need no exact logits: the fast head alone
            lm_head = lm_head.head
        self.weight: torch.Tensor | None
        self.bias: torch.Tensor | None
        if isinstance(lm_head, PlannedLinear):
            self._init_planned(lm_head, token_ids)
            return
        assert isinstance(lm_head, nn.Linear), type(lm_head)
        weight: torch.Tensor = lm_head.weight
        bias: torch.Tensor | None = lm_head.bias
        if token_ids is not None:
            token_ids = token_ids.to(weight.device)
            weight = weight[token_ids].contiguous()  # a copy: ~1/6 of the head's bytes for 8k tokens
            bias = bias[token_ids] if bias is not None else None
        self.token_ids, self.weight, self.bias = token_ids, weight, bias
        self.num_tokens = weight.shape[0]

    def _init_planned(self, lm_head: PlannedLinear, token_ids: torch.Tensor | None) -> None:
        self.weight, self.bias = None, None
        self.num_tokens = lm_head.out_features if token_ids is None else token_ids.shape[0]
        if token_ids is None:
            self.head = lm_head
            return
        dense = lm_head.dense_weight()
        self.token_ids = token_ids = token_ids.to(dense.device)
        weight = dense[token_ids].float()  # [subset, hidden]
        bias = getattr(lm_head.module, "bias", None)
        bias = bias[token_ids] if bias is not None else None
        primary = lm_head.weight_format
        quantizers: dict[str, Callable[[torch.Tensor], QuantizedWeight]] = {
            "int4": quantize_int4,
            "int8": quantize_int8,
        }
        quantize = quantizers.get(primary)
        native = native_linear_of(lm_head)
        if quantize and native is not None:  # the subset on the target's native kernels
            self.head = NativeQuantizedLinear(quantize(weight), bias, native.kernels, native.threads, native.two_term)
        else:
            self.head = QuantizedLinear(quantize(weight), bias, dense.device) if quantize else None
        if self.head is None:
            self.weight, self.bias = weight.to(dense.dtype), bias

    @property
    def size(self) -> int:
        return self.num_tokens

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., size] logits over this vocabulary (index i is token `to_target(i)`)."""
        if self.head is not None:
            return self.head(hidden)
        assert self.weight is not None
        return F.linear(hidden, self.weight.to(hidden.dtype), self.bias)

    def to_target(self, indices: torch.Tensor) -> torch.Tensor:
        """Target token ids for indices into this vocabulary."""
        return indices if self.token_ids is None else self.token_ids[indices]


def read_draft_vocabulary(folder: Path, target_vocab_size: int) -> torch.Tensor | None:
    """The token ids in `folder`/draft_vocab.json, checked against the target; None without the file."""
    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    try:
        token_ids = json.loads(path.read_text())["token_ids"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DrafterError(f"{path}: expected a JSON object with a token_ids list ({error})") from error
    if not token_ids or not all(isinstance(t, int) and 0 <= t < target_vocab_size for t in token_ids):
        raise DrafterError(
            f"{path}: token_ids must be a non-empty list of token ids below the target's vocab_size={target_vocab_size}"
        )
    if len(set(token_ids)) != len(token_ids):
        raise DrafterError(f"{path}: token_ids has duplicates")
    return torch.tensor(token_ids, dtype=torch.int64)


def write_draft_vocabulary(folder: Path, token_ids: torch.Tensor) -> None:
    (Path(folder) / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": token_ids.tolist()}) + "\n")
