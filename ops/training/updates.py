"""The optimisation loop both drafter trainers share: AdamW, warm-up + cosine learning rate,
a fixed number of sequences per update, gradient clipping, one loss per update for the curves.

Each update draws its sequences from `random.Random(update)` and hands the same generator to the
per-sequence loss (DFlash draws its anchors from it), so a resumed run repeats exactly the updates
an uninterrupted one would have made.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import TypeVar

import torch

_Seq = TypeVar("_Seq")  # a training sequence, as the trainer captured it
SequenceLoss = Callable[[_Seq, random.Random], torch.Tensor | None]  # None: sequence too short


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)


def lr_at(step: int, total: int, base: float, warmup: int = 20) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


def vocabulary_index(vocab: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target token id -> its index in the training vocabulary (0 for tokens outside it)."""
    index = torch.zeros(vocab_size, dtype=torch.int64)
    index[vocab] = torch.arange(len(vocab))
    return index


def run_updates(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    data: list[_Seq],
    sequence_loss: SequenceLoss[_Seq],
    lr: float,
    sequences_per_update: int,
    start_update: int,
    stop_update: int,
    total_updates: int,
    progress,
    prepare_batch: Callable[[list[_Seq]], list] | None = None,
) -> list[float]:
    """Updates [start_update, stop_update) of a schedule over total_updates; the loss of each.

    `prepare_batch` turns the update's drawn sequences into what `sequence_loss` reads, all at
    once (the EAGLE-3 trainer recomputes their target states in one batched prefill)."""
    history = []
    for update in range(start_update, stop_update):
        rng = random.Random(update)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(update, total_updates, lr)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        batch = rng.sample(data, sequences_per_update)
        for sequence in prepare_batch(batch) if prepare_batch is not None else batch:
            loss = sequence_loss(sequence, rng)
            if loss is None:
                continue
            loss = loss / sequences_per_update
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        history.append(total)
        progress.update(1)
        progress.set_postfix(loss=f"{total:.3f}")
    return history
