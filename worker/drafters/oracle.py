"""An oracle drafter: it proposes the target's own greedy continuation, computed ahead.

Not a serving mode. It measures the ceiling of speculation (every draft accepted, so a step
emits depth + 1 tokens for the price of one verification forward) in benchmarks, and it pins
the runner's acceptance bookkeeping in tests. With `num_wrong_siblings`, every node of the
correct path gets wrong siblings, so a tree forward verifies more nodes than it accepts:

    depth 3, one wrong sibling each:  c1 w1 c2 w2 c3 w3   (w_j is a sibling of c_j)
    parents                           -1 -1  0  0  2  2
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

import torch

from worker.engine.drafter_protocol import TargetStates
from worker.engine.sequence import Sequence
from worker.models.decoder import Decoder
from worker.speculation.tree import ROOT, DraftTree


class OracleDrafter:
    name = "oracle"
    hidden_layers: tuple[int, ...] = ()
    wants_final_hidden = False

    def __init__(self, reference: Seq[int], depth: int, vocab_size: int, num_wrong_siblings: int = 0):
        """reference: prompt + plain greedy continuation, long enough to cover every proposal."""
        assert depth >= 1 and 0 <= num_wrong_siblings < vocab_size - 1
        self.reference, self.depth = list(reference), depth
        self.vocab_size, self.num_wrong_siblings = vocab_size, num_wrong_siblings

    def start(self, sequence: Sequence) -> None:
        return None

    def observe(self, state: None, committed: TargetStates) -> None:
        pass

    def propose(self, state: None, sequence: Sequence) -> DraftTree | None:
        num_tokens = sequence.num_tokens
        if sequence.token_ids != self.reference[:num_tokens]:  # off the reference: nothing to offer
            return None
        ahead = self.reference[num_tokens : num_tokens + self.depth]
        return self._tree(ahead) if ahead else None

    def state_bytes(self, state: None) -> int:
        return 0

    def _tree(self, path: list[int]) -> DraftTree:
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        parent = ROOT
        for depth, token in enumerate(path, start=1):
            correct = len(tokens)
            for offset in range(self.num_wrong_siblings + 1):
                tokens.append((token + offset) % self.vocab_size)  # offset 0 is the correct token
                parents.append(parent)
                depths.append(depth)
            parent = correct
        return DraftTree(tokens, parents, depths)


@torch.inference_mode()
def greedy_reference(decoder: Decoder, prompt_ids: Seq[int], num_new_tokens: int) -> list[int]:
    """Prompt + `num_new_tokens` of plain greedy decoding (one token per forward), no speculation.
    `decoder` may be a HybridDecoder: only the shared forward and cache contract is used."""
    token_ids = list(prompt_ids)
    cache = decoder.new_cache(len(token_ids) + num_new_tokens)
    pending = token_ids
    device = decoder.device
    for _ in range(num_new_tokens):
        start = cache.length
        positions = torch.arange(start, start + len(pending), device=device)
        logits = decoder(torch.tensor(pending, device=device), positions, cache, num_logits=1).logits
        cache.commit(len(pending))
        token_ids.append(int(logits[-1].argmax()))
        pending = token_ids[-1:]
    return token_ids
