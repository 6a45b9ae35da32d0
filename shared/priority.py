"""Priority classes: a request's `priority` (vLLM's meaning: lower runs sooner), per-key defaults and caps.

A key's policy is written `ARBOR_KEY_PRIORITIES="key=default:cap,..."`: requests made with `key`
that name no priority get `default`, and none may claim a class better (lower) than `cap`; a
request asking for more is served at `cap`, as a hint it has no right to is not an error. A key
without a policy (or no auth at all) has default 0 and no cap.

    "batch-key=10:5"   no priority -> 10; priority 0 -> 5; priority 20 -> 20
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_PRIORITY = 0
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1  # a request's bounds (vLLM's is any int; this is int32)


@dataclass(frozen=True, slots=True)
class KeyPriority:
    default: int = DEFAULT_PRIORITY
    cap: int | None = None  # the best (lowest) priority the key may claim; None: any


def parse_key_priorities(text: str) -> dict[str, KeyPriority]:
    """'k1=10:5,k2=3' -> {k1: KeyPriority(10, 5), k2: KeyPriority(3, None)}; raises ValueError."""
    policies: dict[str, KeyPriority] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, spec = item.rpartition("=")
        if not sep or not key:
            raise ValueError(f"key_priorities: expected key=default[:cap], got an item without '=' ({len(item)} chars)")
        default, _, cap = spec.partition(":")
        try:
            policy = KeyPriority(int(default), int(cap) if cap else None)
        except ValueError:
            raise ValueError(f"key_priorities: default and cap must be integers, got {spec!r}") from None
        if policy.cap is not None and policy.default < policy.cap:
            raise ValueError(f"key_priorities: default {policy.default} is better than the cap {policy.cap}")
        policies[key] = policy
    return policies


def resolve(requested: int | None, policy: KeyPriority | None) -> int:
    """The priority a request runs at: its own, else its key's default; never better than the cap."""
    policy = policy or KeyPriority()
    priority = policy.default if requested is None else requested
    return priority if policy.cap is None else max(priority, policy.cap)
