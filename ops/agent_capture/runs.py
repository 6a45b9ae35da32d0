"""The moving parts of a capture: npm installs, `arbor up`, the logging proxy as a child process,
and one CLI run with a timeout."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ops.agent_capture.clis import AGENT_CLIS, AgentCli

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 900.0
CLI_TIMEOUT_S = 900.0  # a CPU prefill of Claude Code's prompt on a busy machine takes minutes
UP_TIMEOUT_S = 600.0
PROXY_TIMEOUT_S = 30.0
# what a CLI's process inherits from ours: nothing else (no API keys of the machine's user)
INHERITED_ENV = ("PATH", "LANG", "TERM", "TMPDIR")
README = "# demo\n\nA one-file project the agent CLIs are asked about.\n"


@dataclass
class CliRun:
    name: str
    returncode: int | None  # None: killed at the timeout
    stdout: str
    stderr: str
    elapsed_s: float
    records: list[dict[str, Any]] = field(default_factory=list)

    def failed_records(self) -> list[dict[str, Any]]:
        return [record for record in self.records if record["status"] >= 400 or "error" in record["events"]]

    def summary(self) -> dict[str, Any]:
        routes = [f"{record['method']} {record['path']} -> {record['status']}" for record in self.records]
        return {
            "cli": self.name,
            "returncode": self.returncode,
            "elapsed_s": round(self.elapsed_s, 1),
            "requests": routes,
            "answer": self.stdout.strip()[-300:],
            "stderr": self.stderr.strip()[-600:],
        }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def install_clis(prefix: Path, names: list[str], versions: dict[str, str]) -> list[AgentCli]:
    """npm-installs the CLIs under `prefix` (quick when they are there already), at their pins or
    at `versions[name]` (`latest` too); returns them with the versions npm installed."""
    pinned = [AGENT_CLIS[name] for name in names]
    specs = [f"{cli.package}@{versions.get(cli.name, cli.version)}" for cli in pinned]
    command = ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error"]
    subprocess.run([*command, *specs], check=True, timeout=INSTALL_TIMEOUT_S)
    return [dataclasses.replace(cli, version=installed_version(prefix, cli.package)) for cli in pinned]


def installed_version(prefix: Path, package: str) -> str:
    return str(json.loads((prefix / "node_modules" / package / "package.json").read_text())["version"])


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    return {name: os.environ[name] for name in INHERITED_ENV if name in os.environ} | extra


def run_cli(cli: AgentCli, bin_dir: Path, root: Path, base_url: str, model: str, prompt: str) -> CliRun:
    """One prompt, one-shot, in `root/project` with its home at `root/home`."""
    home, project = root / "home", root / "project"
    project.mkdir(parents=True)
    (project / "README.md").write_text(README)
    args, env = cli.prepare(home, base_url, model)
    started = time.monotonic()
    command = [str((bin_dir / cli.binary).resolve()), *args, prompt]
    with subprocess.Popen(
        command, cwd=project, env=_child_env(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=CLI_TIMEOUT_S)
            returncode: int | None = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: the CLI and whatever it spawned
            stdout, stderr = process.communicate()
            returncode = None
    return CliRun(cli.name, returncode, stdout, stderr, time.monotonic() - started)


def _wait_for_port(port: int, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"exited with {process.returncode}"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


@contextlib.contextmanager
def logging_proxy(upstream_url: str, log_dir: Path) -> Iterator[str]:
    """The proxy in a child process; yields its URL. Records are complete once this exits."""
    port = free_port()
    command = [sys.executable, "-m", "ops.agent_capture.proxy", "--upstream", upstream_url]
    command += ["--log-dir", str(log_dir), "--port", str(port)]
    with subprocess.Popen(command, cwd=REPO_ROOT, env=_child_env({"PYTHONPATH": str(REPO_ROOT)})) as process:
        try:
            _wait_for_port(port, process, PROXY_TIMEOUT_S)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.send_signal(signal.SIGINT)  # uvicorn finishes the answers in flight first
            process.wait(PROXY_TIMEOUT_S)


@contextlib.contextmanager
def arbor_up(
    base_url: str | None, log_path: Path | None = None, settings: dict[str, str] | None = None
) -> Iterator[str]:
    """`base_url` as it is, or `arbor up` on the default model on a free port for the duration,
    with `settings` (ARBOR_* variables) added to its environment."""
    if base_url is not None:
        yield base_url.rstrip("/")
        return
    port = free_port()
    command = [sys.executable, "-m", "ops.cli", "up", "--port", str(port)]
    log = log_path.open("wb") if log_path is not None else subprocess.DEVNULL
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT)) | (settings or {})
    env.pop("REDIS_URL", None)  # its own embedded Redis
    with subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT) as process:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}", process, UP_TIMEOUT_S)
            yield f"http://127.0.0.1:{port}"
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(120)


def wait_until_ready(base_url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5) as client:
        while time.monotonic() < deadline:
            assert process.poll() is None, f"arbor up exited with {process.returncode}"
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{base_url}/health").status_code == 200:
                    return
            time.sleep(1)
    raise TimeoutError(f"arbor up did not serve within {timeout_s} s")


def read_records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
