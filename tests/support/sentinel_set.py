"""A real Redis Sentinel set and a master-replica pair on loopback, for tests (ops/launch/sentinel_set.py)."""

from __future__ import annotations

from ops.launch.sentinel_set import MASTER_NAME, Node, ReplicatedPair, SentinelSet

__all__ = ["MASTER_NAME", "Node", "ReplicatedPair", "SentinelSet"]
