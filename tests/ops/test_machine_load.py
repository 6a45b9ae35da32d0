"""The meter of CPU taken by processes outside a benchmark: /proc arithmetic on fixed files, and
the real /proc read the way the kernel writes it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from ops.bench.machine_load import OtherLoad, machine_busy_ticks, process_ticks

HZ = os.sysconf("SC_CLK_TCK")


def write_proc(root: Path, machine: dict[str, int], processes: dict[int, tuple[int, int]]) -> None:
    """A /proc with an aggregate cpu line and, per pid, utime and stime (a name with ") " in it, as
    a process may have)."""
    line = "cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0".format(**machine)
    (root / "stat").write_text(f"{line}\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    for pid, (utime, stime) in processes.items():
        (root / str(pid)).mkdir(exist_ok=True)
        fields = ["S", "1", "1", "1", "0", "-1", "0", "0", "0", "0", "0", str(utime), str(stime), "0", "0"]
        (root / str(pid) / "stat").write_text(f"{pid} (odd) name) " + " ".join(fields) + "\n")


def test_other_load_is_machine_busy_minus_own_processes_per_second(tmp_path):
    now = [100.0]
    machine = dict(user=1000, nice=0, system=200, idle=5000, iowait=50, irq=0, softirq=10, steal=40)
    write_proc(tmp_path, machine, {11: (300, 20), 12: (50, 5)})
    load = OtherLoad(lambda: [11, 12, 99], proc=tmp_path, clock=lambda: now[0])  # 99: gone, adds nothing
    start = load.sample()
    assert start is not None and start.machine_ticks == 1000 + 200 + 10 + 40  # idle and iowait are not busy
    assert start.own_ticks == 375
    # 2 s later: the machine did 2 cores' worth (4 s of ticks, steal included), ours 1.5 s of it.
    machine.update(user=1000 + 2 * HZ, system=200 + HZ, steal=40 + HZ)
    write_proc(tmp_path, machine, {11: (300 + HZ, 20 + HZ // 2), 12: (50, 5)})
    now[0] = 102.0
    assert load.cores_since(start) == pytest.approx((4 * HZ - 1.5 * HZ) / HZ / 2.0)  # 1.25 cores


def test_other_load_is_unknown_without_proc_and_never_negative(tmp_path):
    assert machine_busy_ticks(tmp_path) is None
    assert OtherLoad(lambda: [], proc=tmp_path).sample() is None
    assert OtherLoad(lambda: [], proc=tmp_path).cores_since(None) is None
    now = [0.0]
    machine = dict(user=10, nice=0, system=0, idle=0, iowait=0, irq=0, softirq=0, steal=0)
    write_proc(tmp_path, machine, {5: (10, 0)})
    load = OtherLoad(lambda: [5], proc=tmp_path, clock=lambda: now[0])
    start = load.sample()
    write_proc(tmp_path, machine, {5: (20, 0)})  # tick sampling can credit ours more than the machine's
    now[0] = 1.0
    assert load.cores_since(start) == 0.0


def test_the_real_proc_credits_cpu_burnt_here_to_this_process():
    assert machine_busy_ticks() > 0
    before = process_ticks([os.getpid()])
    cpu_started = time.thread_time()
    while time.thread_time() - cpu_started < 0.3:  # CPU time, not wall time: load cannot stretch it
        sum(range(1000))
    assert process_ticks([os.getpid()]) - before >= 0.2 * HZ
    assert process_ticks([2**22 + 12345]) == 0  # no such pid
