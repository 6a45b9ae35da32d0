"""Speculation statistics, per request and summed across requests. Torch-free.

`target_forwards` counts decode forwards of the target (one per draft-verify-commit cycle, or
one per token without speculation); prefill forwards are timed but not counted, so
`tokens_per_forward` is exactly 1 for plain decoding and k+1 when every draft of k is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SourceCounts:
    """What one draft source proposed and the target accepted (a source: the tree's `source`,
    the drafter's name unless the drafter said otherwise)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, drafts: int, draft_tokens: int, accepted_tokens: int) -> None:
        self.drafts += drafts
        self.draft_tokens += draft_tokens
        self.accepted_tokens += accepted_tokens

    def to_dict(self) -> dict[str, int]:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens}


def add_to_source(
    by_source: dict[str, SourceCounts], source: str, drafts: int, draft_tokens: int, accepted: int
) -> None:
    """Count a step's drafts under `source`; a step that drafted nothing counts nowhere."""
    if draft_tokens:
        by_source.setdefault(source, SourceCounts()).add(drafts, draft_tokens, accepted)


@dataclass(slots=True)
class SpecStats:
    target_forwards: int = 0
    drafts: int = 0  # draft trees or chains proposed (a drafter may propose nothing)
    draft_tokens: int = 0  # nodes proposed
    accepted_tokens: int = 0  # nodes accepted
    generated_tokens: int = 0  # tokens emitted by decode forwards (accepted + one bonus each)
    accepted_per_depth: list[int] = field(default_factory=list)  # [d] = accepted nodes at depth d+1
    by_source: dict[str, SourceCounts] = field(default_factory=dict)  # drafts, draft and accepted tokens per source
    last_source: str = ""  # the source of the latest step's draft ("" when it drafted nothing)
    prefill_tokens: int = 0
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s

    @property
    def tokens_per_forward(self) -> float:
        return self.generated_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / drafts, as vLLM reports it."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    def record_step(self, num_draft_tokens: int, num_accepted: int, num_emitted: int, source: str = "") -> None:
        self.target_forwards += 1
        self.last_source = source if num_draft_tokens else ""
        add_to_source(self.by_source, source, 1, num_draft_tokens, num_accepted)
        self.drafts += 1 if num_draft_tokens else 0
        self.draft_tokens += num_draft_tokens
        self.accepted_tokens += num_accepted
        self.generated_tokens += num_emitted
        while len(self.accepted_per_depth) < num_accepted:
            self.accepted_per_depth.append(0)
        for depth in range(num_accepted):
            self.accepted_per_depth[depth] += 1

    def merge(self, other: SpecStats) -> None:
        for name in (
            "target_forwards",
            "drafts",
            "draft_tokens",
            "accepted_tokens",
            "generated_tokens",
            "prefill_tokens",
            "prefill_s",
            "draft_s",
            "verify_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for depth, count in enumerate(other.accepted_per_depth):
            if depth < len(self.accepted_per_depth):
                self.accepted_per_depth[depth] += count
            else:
                self.accepted_per_depth.append(count)
        for source, counts in other.by_source.items():
            add_to_source(self.by_source, source, counts.drafts, counts.draft_tokens, counts.accepted_tokens)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target_forwards": self.target_forwards,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_depth": list(self.accepted_per_depth),
            "draft_sources": {source: counts.to_dict() for source, counts in self.by_source.items()},
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "acceptance_length": round(self.acceptance_length, 4),
            "prefill_tokens": self.prefill_tokens,
            "prefill_s": round(self.prefill_s, 6),
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
            "decode_s": round(self.decode_s, 6),
            "tokens_per_s": round(self.generated_tokens / self.decode_s, 3) if self.decode_s else 0.0,
        }
