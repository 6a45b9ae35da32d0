"""The prompt's own logprobs, read off the prefill forward that runs anyway.

A prefill chunk over positions [s, s + T) gives, with logits for every row, the distribution of
each next token: row j predicts the token at s + j + 1. So prompt token i (i >= 1) gets
log_softmax(row for position i - 1)[token i]; the first token has nothing before it (None in the
API, as OpenAI's legacy echo and vLLM's prompt_logprobs give it).

    prompt  [BOS, The, cat, sat]     prefill runs [BOS, The, cat] (sat is the root of decoding)
    rows     0    1    2             row 0 -> logprob(The), row 1 -> logprob(cat), row 2 -> logprob(sat)

The root (the last prompt token) is never prefilled, and it need not be: its row predicts the
first generated token, not a prompt token. A lane prefilled again (preempted, or resumed with its
emitted tokens) recomputes rows it has already recorded: they are skipped.

A prefix served from the prefill cache has no logits, so a lane that wants prompt logprobs does
not look the cache up (`ModelStepper`); it still stores its prefix for other lanes.

Logprobs are of the raw logits, like the sampled tokens' (`logits_processing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from worker.engine.logits_processing import TokenLogprobs


@dataclass(slots=True)
class RankedLogprobs:
    entry: TokenLogprobs
    rank: int  # 1: the most likely token


@dataclass(slots=True)
class PromptLogprobs:
    num_prompt_tokens: int
    num_top: int  # top logprobs per token beside the prompt token's own
    entries: list[RankedLogprobs] = field(default_factory=list)  # entry i: prompt token i + 1

    @property
    def complete(self) -> bool:
        return len(self.entries) == self.num_prompt_tokens - 1

    def record(self, start: int, logits: torch.Tensor, token_ids: list[int]) -> None:  # logits [T, V]
        """A prefill chunk's rows; row j is position start + j and predicts token_ids[start + j + 1]."""
        first = len(self.entries) - start  # rows already recorded (a prefill run again)
        assert first >= 0, f"prompt logprobs missing for positions {len(self.entries)}..{start - 1}"
        last = min(logits.shape[0], self.num_prompt_tokens - 1 - start)  # rows that predict a prompt token
        if first >= last:
            return
        rows = logits[first:last].to(torch.float32)  # [R, V]
        targets = torch.tensor(token_ids[start + first + 1 : start + last + 1], device=rows.device)  # [R]
        logprobs = torch.log_softmax(rows, dim=-1)  # [R, V]
        chosen = logprobs.gather(1, targets[:, None])  # [R, 1]
        ranks = (logprobs > chosen).sum(dim=-1) + 1  # [R]
        if self.num_top > 0:
            top_values, top_ids = torch.topk(logprobs, min(self.num_top, logprobs.shape[-1]))  # [R, k]
            tops = [list(zip(ids, values)) for ids, values in zip(top_ids.tolist(), top_values.tolist())]
        else:
            tops = [[] for _ in range(rows.shape[0])]
        for token_id, logprob, rank, top in zip(
            targets.tolist(), chosen[:, 0].tolist(), ranks.tolist(), tops, strict=True
        ):
            self.entries.append(RankedLogprobs(TokenLogprobs(token_id, logprob, top), rank))
