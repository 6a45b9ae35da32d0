"""The processes `arbor up` runs, kept running: each one's output forwarded, its death noticed,
and a restart scheduled by `RestartPolicy` (ops/launch/restart_policy.py).

Each child writes into a pipe that a thread forwards line by line to our stdout, prefixed with
the child's name (`worker-1 | ...`, as compose does), keeping its last lines for the message
that stops a crash loop.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO

from ops.launch.restart_policy import CrashHistory, RestartPolicy, restartable

LOG_TAIL_LINES = 12
STOP_TIMEOUT_S = 40.0
FORWARD_DRAIN_S = 1.0


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Why the stack stops: a process that cannot be kept running."""

    name: str
    reason: str
    log_tail: list[str]

    def message(self) -> str:
        tail = "".join(f"  {self.name} | {line}" for line in self.log_tail) or "  (it printed nothing)\n"
        return f"arbor up: {self.name} {self.reason}; stopping. Its last lines:\n{tail}"


@dataclass(slots=True)
class SupervisedProcess:
    name: str
    argv: list[str]
    env: dict[str, str]
    history: CrashHistory
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restart_at: float | None = None  # monotonic time of the scheduled restart, while it is down
    restarts: int = 0
    log_tail: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=LOG_TAIL_LINES))
    forwarder: threading.Thread | None = None  # the current incarnation's output, line by line
    hide: Callable[[str], bool] | None = None  # lines neither forwarded nor kept (arbor up's own polls)

    def start(self) -> None:
        # A new session each, so the terminal's Ctrl-C reaches only `arbor up`, which stops them in order.
        self.process = subprocess.Popen(
            self.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started_at = time.monotonic()
        self.restart_at = None
        assert self.process.stdout is not None
        self.forwarder = threading.Thread(target=self._forward, args=(self.process.stdout,), daemon=True)
        self.forwarder.start()

    def _forward(self, pipe: IO[bytes]) -> None:
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace")
            hide = self.hide
            if hide is not None and hide(line):
                continue
            self.log_tail.append(line if line.endswith("\n") else line + "\n")
            sys.stdout.write(f"{self.name} | {line}")
            sys.stdout.flush()

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    """Keeps its processes running from `poll()` calls on one thread (the `arbor up` main loop).

    `on_restart(name)` is called for every restart, so it can be counted where tools see it.
    """

    def __init__(self, policy: RestartPolicy, on_restart: Callable[[str], None] | None = None) -> None:
        self.policy = policy
        self.children: list[SupervisedProcess] = []
        self._on_restart = on_restart

    def add(
        self, name: str, argv: list[str], env: dict[str, str], hide: Callable[[str], bool] | None = None
    ) -> SupervisedProcess:
        child = SupervisedProcess(name, argv, env, CrashHistory(self.policy), hide=hide)
        child.start()
        self.children.append(child)
        return child

    def poll(self) -> GiveUp | None:
        """Notice deaths, start what is due; a `GiveUp` once a process cannot be kept running."""
        now = time.monotonic()
        for child in self.children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    self._restart(child)
                continue
            returncode = child.process.poll() if child.process is not None else None
            if returncode is not None:
                give_up = self._crashed(child, returncode, now)
                if give_up is not None:
                    return give_up
        return None

    def _crashed(self, child: SupervisedProcess, returncode: int, now: float) -> GiveUp | None:
        if child.forwarder is not None:
            child.forwarder.join(FORWARD_DRAIN_S)  # its last lines, before they are quoted
        status = f"exited with status {returncode}" if returncode >= 0 else f"was killed by {_signal_name(returncode)}"
        if not restartable(returncode):
            return GiveUp(child.name, f"{status} (a user error: restarting would not help)", list(child.log_tail))
        child.history.record_crash(now, child.started_at)
        if child.history.in_crash_loop():
            crashes = len(child.history.crash_times)
            reason = f"{status}: {crashes} crashes within {self.policy.crash_loop_window_s:.0f} s, a crash loop"
            return GiveUp(child.name, reason, list(child.log_tail))
        backoff_s = child.history.backoff_s()
        print(f"arbor up: {child.name} {status}; restarting it in {backoff_s:.1f} s", file=sys.stderr, flush=True)
        child.restart_at = now + backoff_s
        return None

    def _restart(self, child: SupervisedProcess) -> None:
        child.restarts += 1
        child.start()
        if self._on_restart is not None:
            self._on_restart(child.name)

    def any_down(self) -> bool:
        return any(not child.running for child in self.children)

    def stop_all(self) -> None:
        """Workers first (SIGTERM = drain their lanes), then the gateway: the reverse of starting."""
        stop_all([child.process for child in self.children if child.process is not None])


def stop_all(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process still running, last started first, and wait for them all (killing
    what outlasts `STOP_TIMEOUT_S`)."""
    running = [process for process in reversed(processes) if process.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in running:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"
