"""How hard the property-based tests search: each test's own example count times ARBOR_FUZZ_SCALE.

    @settings(max_examples=fuzz_examples(300), deadline=None)

The default run uses the counts as written (scale 1); `make test-hardening` runs them at 10x.
"""

from __future__ import annotations

import os


def fuzz_examples(num_examples: int) -> int:
    return num_examples * int(os.environ.get("ARBOR_FUZZ_SCALE", "1"))
