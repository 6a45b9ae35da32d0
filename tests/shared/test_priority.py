"""Per-key priority policies: parsing ARBOR_KEY_PRIORITIES and resolving a request's priority."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.priority import KeyPriority, parse_key_priorities, resolve
from shared.settings import GatewaySettings


def test_policies_parse_default_and_optional_cap():
    assert parse_key_priorities(" batch=10:5 , agent=-1 ,") == {"batch": KeyPriority(10, 5), "agent": KeyPriority(-1)}


@pytest.mark.parametrize("text", ["batch", "=3", "batch=high", "batch=1:x", "batch=0:5"])
def test_malformed_policies_are_refused(text):
    with pytest.raises(ValueError, match="key_priorities"):
        parse_key_priorities(text)


def test_the_setting_reads_policies_and_refuses_bad_ones_naming_the_field():
    assert GatewaySettings(key_priorities="k=3:1").key_priorities == {"k": KeyPriority(3, 1)}
    with pytest.raises(ValidationError, match="key_priorities"):
        GatewaySettings(key_priorities="k=oops")


def test_resolution_takes_the_default_and_holds_the_cap():
    policy = KeyPriority(default=10, cap=5)
    assert [resolve(r, policy) for r in (None, 0, 5, 7, 20)] == [10, 5, 5, 7, 20]
    assert [resolve(r, None) for r in (None, -4, 9)] == [0, -4, 9]
