"""Reading other processes from /proc (Linux): their children, command lines and resident memory."""

from __future__ import annotations

from pathlib import Path


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (every thread's list, so children started from any thread count)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(child) for child in (task / "children").read_text().split()]
    return children


def command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]


def rss_bytes(pid: int) -> int:
    """Resident set size (VmRSS) of a running process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            number, unit = line.split()[1:3]
            assert unit == "kB", line
            return int(number) * 1024
    raise AssertionError(f"no VmRSS for process {pid} (a zombie?)")
