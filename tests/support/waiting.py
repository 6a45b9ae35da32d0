"""Polling for a condition in tests, with a deadline and a message that says what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], object], timeout_s: float, what: str, poll_s: float = 0.02) -> Any:
    """The condition's first truthy value; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
