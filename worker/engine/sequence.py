"""One request's decoding state, as the model runner sees it.

The cache holds every token but the last (`root`): the last token is fed at the start of the
next decode step, where drafts hang off it. A fresh request and a resumed one (prompt plus
tokens another worker already emitted) are the same shape: prefill `token_ids[:-1]`, then decode.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from shared.sampling import SamplingParams
from worker.engine.grammar_constraint import GrammarConstraint
from worker.engine.prompt_logprobs import PromptLogprobs
from worker.engine.stats import SpecStats
from worker.models.kv_cache import KVCache
from worker.models.kv_pool import PagedKVCache


@dataclass(slots=True)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    cache: KVCache | PagedKVCache  # (or a hybrid model's HybridCache): the same interface
    generator: torch.Generator
    output_ids: list[int] = field(default_factory=list)  # emitted so far (incl. any resumed tokens)
    drafter_state: Any = None
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: Literal["stop", "length"] | None = None  # set by the runner or the text pipeline
    stop_ids: frozenset[int] = frozenset()  # tokens that end it: EOS (unless ignore_eos) and stop_token_ids
    constraint: GrammarConstraint | None = None  # a structured output's progress (params.structured)
    draft_limit: int | None = None  # draft nodes its next decode step may verify (None: the drafter's all)
    prompt_logprobs: PromptLogprobs | None = None  # asked for: its prefill computes logits for every row

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def root_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_to_prefill(self) -> int:
        return self.num_tokens - 1 - self.cache.length

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
