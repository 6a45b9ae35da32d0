from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.tiny_drafters import one_torch_thread


@pytest.fixture(autouse=True, scope="package")
def _one_thread() -> Iterator[None]:
    with one_torch_thread():
        yield
