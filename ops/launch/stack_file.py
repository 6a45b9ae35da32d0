"""Where a running `arbor up` says how to reach it, so `arbor top` needs no environment variables.

`arbor up` writes `stack-<port>.json` (its pid, the gateway's URL, the Redis URL) into the runtime
directory (`$XDG_RUNTIME_DIR/arbor`, else `<tmp>/arbor-<uid>`, private to the user) and removes it
when it stops. A reader keeps only files whose `arbor up` is still alive, so a stack that was
killed leaves nothing that misleads. The file may hold a Redis password (REDIS_URL's): it is
readable by its owner alone.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class StackInfo:
    pid: int
    port: int
    gateway_url: str
    redis_url: str
    num_workers: int


def runtime_dir(environ: dict[str, str] | None = None) -> Path:
    environ = dict(os.environ) if environ is None else environ
    base = environ.get("XDG_RUNTIME_DIR")
    if base:
        return Path(base) / "arbor"
    return Path(tempfile.gettempdir()) / f"arbor-{os.getuid()}"


def write_stack(info: StackInfo, directory: Path) -> Path:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = directory / f"stack-{info.port}.json"
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump(asdict(info), file)
    temporary.replace(path)  # readers never see half a file
    return path


def running_stacks(directory: Path) -> list[StackInfo]:
    """Every stack whose `arbor up` is alive, by port."""
    stacks = []
    for path in sorted(directory.glob("stack-*.json")):
        try:
            info = StackInfo(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue  # being written, or not ours
        if _alive(info.pid):
            stacks.append(info)
        else:
            path.unlink(missing_ok=True)  # its `arbor up` was killed before it could remove it
    return sorted(stacks, key=lambda info: info.port)


def find_stack(directory: Path, port: int | None = None) -> StackInfo:
    """The one running stack (on `port`, if given); a ValueError saying what to do otherwise."""
    stacks = [info for info in running_stacks(directory) if port is None or info.port == port]
    if not stacks:
        where = f" on port {port}" if port is not None else ""
        raise ValueError(f"no running `arbor up` found{where}: start one with `arbor up`, or pass --redis-url")
    if len(stacks) > 1:
        ports = ", ".join(str(info.port) for info in stacks)
        raise ValueError(f"several stacks are running (ports {ports}): pass --port to pick one")
    return stacks[0]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process holds the pid now: our `arbor up` is gone
    return True
