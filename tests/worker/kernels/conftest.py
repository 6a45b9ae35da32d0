from __future__ import annotations

import glob
import shutil

import pytest


@pytest.fixture(scope="session")
def clang() -> str:
    """clang under its plain name or a versioned one (Debian's clang-14); the test skips without one."""
    found = shutil.which("clang") or next(iter(sorted(glob.glob("/usr/bin/clang-[0-9]*"))), None)
    if found is None:
        pytest.skip("no clang installed (apt-get install clang)")
    return found
