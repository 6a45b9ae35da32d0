"""Freezing the start-up heap: what exists then is out of the collector's reach, what comes later is not."""

from __future__ import annotations

import gc
import weakref

from shared.heap import freeze_startup_heap


class Cycle:
    def __init__(self) -> None:
        self.me = self  # only the collector frees it


def test_what_start_up_made_is_frozen_and_later_cycles_are_still_collected() -> None:
    assert gc.get_freeze_count() == 0
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 1000, "the imported modules and everything else alive are frozen"
        later = Cycle()
        collected = weakref.ref(later)
        del later
        gc.collect()
        assert collected() is None, "a cycle made after the freeze is collected as ever"
    finally:
        gc.unfreeze()  # this process is the test run, not a service
