"""When `arbor up` restarts a process that died, and when it gives up: plain arithmetic, no processes.

A process that exits unexpectedly is restarted after a capped exponential backoff (0.5 s, 1 s,
2 s, ... at most `max_backoff_s`), counted from its recent crashes: one that then runs for
`stable_after_s` is forgiven its history, so a worker that dies once a day restarts at once
every time. `crash_loop_restarts` crashes within `crash_loop_window_s` is a crash loop: the
stack stops with one message rather than restarting forever. A process that exits with the
CLI's user-error status (2: a bad flag, a missing model) is never restarted: the same command
would fail the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

USER_ERROR_STATUS = 2  # what `arbor` exits with for a user's mistake (ops/cli.py)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 10.0
    crash_loop_restarts: int = 5
    crash_loop_window_s: float = 120.0
    stable_after_s: float = 60.0


@dataclass(slots=True)
class CrashHistory:
    """One supervised process's recent crashes (monotonic seconds)."""

    policy: RestartPolicy
    crash_times: list[float] = field(default_factory=list)

    def record_crash(self, now: float, started_at: float) -> None:
        if now - started_at >= self.policy.stable_after_s:
            self.crash_times.clear()  # it ran long enough: this crash starts a new history
        self.crash_times.append(now)
        self.crash_times[:] = [t for t in self.crash_times if now - t <= self.policy.crash_loop_window_s]

    def in_crash_loop(self) -> bool:
        return len(self.crash_times) >= self.policy.crash_loop_restarts

    def backoff_s(self) -> float:
        """The wait before the next start: doubles with each recent crash, capped."""
        recent = max(0, len(self.crash_times) - 1)
        return min(self.policy.max_backoff_s, self.policy.initial_backoff_s * 2**recent)


def restartable(returncode: int) -> bool:
    """Whether an unexpected exit is worth a restart: not a user error, which would repeat."""
    return returncode != USER_ERROR_STATUS
