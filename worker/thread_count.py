"""How many intra-op (OpenMP) threads a worker's model gets: its share of the cores it really has.

Why not torch's default (one thread per core in every worker): OpenMP threads spin-wait for each
other, so when the workers of a host together run more threads than it has cores, a thread that
loses its core stalls the whole op. Measured through the whole stack on the 2-core development VM
(SmolLM2-135M int4, `none`, 8 streaming clients x 2 requests x 64 tokens, 2026-12-01):

    2 workers x 1 thread   70.4 tokens/s      1 worker x 2 threads   43.7 tokens/s
    2 workers x 2 threads  17.0 tokens/s      1 worker x 1 thread    35.1 tokens/s

Oversubscribing cost 4x; leaving a core to Redis, the gateway and the clients did not pay (they
take a few percent of one). So each worker gets its share:

    threads = max(1, cores // workers)      2 cores: 1 worker -> 2, 2 workers -> 1;  16 cores, 4 -> 4

`cores` is what the process may run on (its CPU affinity, which containers' cpusets set). A GPU
worker's model runs on the GPU: its CPU threads only drive it, and the same rule applies.
ARBOR_THREADS overrides it.
"""

from __future__ import annotations

import os


def intra_op_threads(cores: int, workers: int) -> int:
    assert cores >= 1 and workers >= 1, (cores, workers)
    return max(1, cores // workers)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
