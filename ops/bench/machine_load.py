"""How much CPU processes outside a benchmark take while it runs, read from /proc (Linux).

The gateway-vs-in-process comparison needs it. The serving path needs a second core: the gateway,
Redis and the client run beside the worker's model. In-process generate needs only one. So on a
2-core machine anything else that runs takes the serving path's core first. One busy-loop process
beside the comparison moved its paired ratio from 0.989 to 0.944 (40 pairs each, 2026-11-30).

Each pair therefore carries the cores that other processes used while it ran:

    (machine busy ticks - the benchmark's own processes' ticks) / clock ticks per second / seconds

"Busy" counts hypervisor steal too, since a stolen tick is one no process of ours got. The clock is
USER_HZ (100 a second), so a 0.5 s pair resolves about 0.02 of a core.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# /proc/stat's aggregate "cpu" line: user nice system idle iowait irq softirq steal ...
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)
# /proc/<pid>/stat after the ")" that ends the command name: utime and stime are fields 12 and 13
_UTIME, _STIME = 11, 12


@dataclass(slots=True, frozen=True)
class LoadSample:
    machine_ticks: int
    own_ticks: int
    at_s: float  # time.monotonic()


class OtherLoad:
    """`sample()` now, `cores_since(sample)` later: the cores others used in between (None off Linux)."""

    def __init__(
        self, own_pids: Callable[[], Sequence[int]], proc: Path = PROC, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._own_pids = own_pids  # asked each time: workers come and go
        self._proc = proc
        self._clock = clock
        self._ticks_per_s = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def sample(self) -> LoadSample | None:
        machine = machine_busy_ticks(self._proc)
        if machine is None:
            return None
        return LoadSample(machine, process_ticks(self._own_pids(), self._proc), self._clock())

    def cores_since(self, start: LoadSample | None) -> float | None:
        end = self.sample()
        if start is None or end is None or end.at_s <= start.at_s:
            return None
        others = (end.machine_ticks - start.machine_ticks) - (end.own_ticks - start.own_ticks)
        return max(others, 0) / self._ticks_per_s / (end.at_s - start.at_s)


def machine_busy_ticks(proc: Path = PROC) -> int | None:
    """All CPUs' non-idle ticks since boot (steal included); None where there is no /proc/stat."""
    try:
        first_line = (proc / "stat").read_text().split("\n", 1)[0]
    except OSError:
        return None
    values = [int(value) for value in first_line.split()[1:]]
    return sum(values[index] for index in _BUSY_FIELDS if index < len(values))


def process_ticks(pids: Sequence[int], proc: Path = PROC) -> int:
    """User + system ticks of these processes, all their threads; a process that is gone adds 0."""
    total = 0
    for pid in pids:
        try:
            fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += int(fields[_UTIME]) + int(fields[_STIME])
    return total
