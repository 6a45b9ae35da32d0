"""Which rows an MTP head forward runs for one lane, and what each row's attention sees.

The head's K/V cache is its own one-layer KVCache per lane. Its slots are not positions: a head
restarted after a dormant stretch skips the pairs it slept through (mtp.py), so slot s holds
some pair at some position, its key rotated at that position when written (RoPE is relative, so
a row at position p attends to each key by p minus the key's own position, holes or not).

Two shapes of rows:
    a run      rows at slots [start, start + T), row i seeing every slot below start + i (+ itself):
               the committed pairs (catching up) or a chain of drafts;
    tree rows  row i at slot start + i, seeing the committed slots [0, cache.length), the scratch
               slots of its ancestors (`scratch[i]`), and itself: one depth of a draft tree.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.models.kv_cache import KVCache


@dataclass(slots=True)
class HeadRows:
    cache: KVCache
    token_ids: list[int]  # x_{t+1} of each pair (h_t, x_{t+1})
    positions: list[int]  # each row's RoPE position: the pair's t
    start: int  # the slot the first row writes to
    scratch: list[list[int]] | None = None  # tree rows: each row's ancestors' scratch slots; None: a run

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)

    def visible_slots(self, row: int) -> list[int]:
        """The slots row `row` attends to, its own last."""
        if self.scratch is None:
            return list(range(self.start + row + 1))
        return [*range(self.cache.length), *self.scratch[row], self.start + row]

    def mask(self, device: torch.device) -> torch.Tensor | None:
        """[T, start + T] bool for the per-op attention (None: a single row of a run sees everything)."""
        num_rows, end = self.num_rows, self.start + self.num_rows
        if self.scratch is None:
            if num_rows == 1:
                return None
            mask = torch.ones(num_rows, end, dtype=torch.bool, device=device)
            mask[:, self.start :] = torch.ones(num_rows, num_rows, dtype=torch.bool, device=device).tril()
            return mask
        mask = torch.zeros(num_rows, end, dtype=torch.bool, device=device)
        for row in range(num_rows):
            mask[row, self.visible_slots(row)] = True
        return mask
