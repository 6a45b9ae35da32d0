"""How many intra-op (OpenMP) threads a worker's model gets: from the cores it really has.

Why not torch's default (one per core): on a CPU host the model shares its cores with Redis, the
gateway and the clients, and with the other workers of the host. OpenMP threads spin-wait for
each other, so a thread that loses its core stalls the whole op: on the 2-core development VM two
threads beside a busy process ran a model step 3-4x slower than one thread, and `arbor up
--workers 2` with torch's default (2 threads each on 2 cores) served 16 streams at 3.2 tokens/s in
total. The rule keeps one core for everything that is not a model when there are few, and
splits the rest between the host's workers:

    threads = max(1, (cores - spare) // workers),  spare = 1 below 8 cores, else 2

    2 cores, 1 worker -> 1;  2 cores, 2 workers -> 1;  16 cores, 1 worker -> 14;  16 cores, 4 -> 3

`cores` is what the process may run on (its CPU affinity, which containers' cpusets set). A GPU
worker's model runs on the GPU: its CPU threads only drive it, and the same rule applies.
ARBOR_THREADS overrides it.
"""

from __future__ import annotations

import os

MANY_CORES = 8  # from here two cores are kept for Redis, the gateway and the clients


def intra_op_threads(cores: int, workers: int) -> int:
    assert cores >= 1 and workers >= 1, (cores, workers)
    spare = 1 if cores < MANY_CORES else 2
    return max(1, (cores - spare) // workers)


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
