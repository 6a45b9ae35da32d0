"""Freezing a long-running process's start-up heap out of the garbage collector's reach."""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect start-up's garbage, then move every object left (modules, the app, the model, its
    tokenizer) to the permanent generation, as vLLM does after start-up: full collections then walk
    only what serving allocates. Measured on CPU: a worker with SmolLM2-135M loaded tracks ~326,000
    objects and a full collection took 152 ms, a stall in whatever stream it lands in; the
    gateway's ~50,000 took 17 ms. Frozen objects are still freed by reference counting; only cycles
    among them are never collected. For a process that is the service, not one hosting it (tests)."""
    gc.collect()
    gc.freeze()
