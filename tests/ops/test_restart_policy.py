"""When `arbor up` restarts a dead process, on fixed clocks."""

from __future__ import annotations

from ops.launch.restart_policy import CrashHistory, RestartPolicy, restartable

POLICY = RestartPolicy(
    initial_backoff_s=0.5, max_backoff_s=4.0, crash_loop_restarts=3, crash_loop_window_s=60, stable_after_s=30
)


def test_backoff_doubles_with_each_recent_crash_and_is_capped():
    history = CrashHistory(POLICY)
    waits = []
    for now in (10.0, 11.0, 12.0, 13.0, 14.0):
        history.record_crash(now, started_at=now - 1)
        waits.append(history.backoff_s())
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0]


def test_crashes_in_quick_succession_are_a_crash_loop():
    history = CrashHistory(POLICY)
    for now in (10.0, 12.0):
        history.record_crash(now, started_at=now - 1)
        assert not history.in_crash_loop()
    history.record_crash(14.0, started_at=13.0)
    assert history.in_crash_loop()


def test_crashes_spread_wider_than_the_window_are_no_loop():
    history = CrashHistory(POLICY)
    for now in (0.0, 25.0, 70.0, 95.0, 140.0):
        history.record_crash(now, started_at=now - 20)  # never up long enough to be forgiven
        assert not history.in_crash_loop(), now


def test_a_process_that_ran_long_enough_is_forgiven_its_history():
    history = CrashHistory(POLICY)
    history.record_crash(10.0, started_at=9.0)
    history.record_crash(12.0, started_at=11.0)
    history.record_crash(50.0, started_at=13.0)  # up for 37 s before this crash
    assert history.crash_times == [50.0]
    assert history.backoff_s() == POLICY.initial_backoff_s and not history.in_crash_loop()


def test_a_user_error_is_not_worth_a_restart_but_a_crash_or_a_kill_is():
    assert not restartable(2)
    assert restartable(1) and restartable(-9) and restartable(0)
