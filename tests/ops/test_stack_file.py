"""The runtime file through which tools find a running `arbor up`."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ops.launch.stack_file import StackInfo, find_stack, running_stacks, runtime_dir, write_stack


def info(port: int, pid: int | None = None) -> StackInfo:
    return StackInfo(
        pid=os.getpid() if pid is None else pid,
        port=port,
        gateway_url=f"http://127.0.0.1:{port}",
        redis_url="unix:///tmp/x/redis.sock",
        num_workers=1,
    )


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_the_runtime_dir_follows_xdg_and_falls_back_to_a_private_temp_dir(tmp_path: Path):
    assert runtime_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "arbor"
    assert runtime_dir({}).name == f"arbor-{os.getuid()}"


def test_a_written_stack_is_found_and_readable_by_its_owner_alone(tmp_path: Path):
    path = write_stack(info(8000), tmp_path / "arbor")
    assert find_stack(tmp_path / "arbor") == info(8000)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "arbor").stat().st_mode) == 0o700


def test_a_stack_whose_arbor_up_died_is_ignored_and_its_file_removed(tmp_path: Path):
    path = write_stack(info(8000, pid=dead_pid()), tmp_path)
    assert running_stacks(tmp_path) == []
    assert not path.exists()
    with pytest.raises(ValueError, match="no running `arbor up` found: start one with `arbor up`"):
        find_stack(tmp_path)


def test_several_stacks_need_a_port_to_choose(tmp_path: Path):
    write_stack(info(8001), tmp_path)
    write_stack(info(8000), tmp_path)
    with pytest.raises(ValueError, match=r"ports 8000, 8001\): pass --port"):
        find_stack(tmp_path)
    assert find_stack(tmp_path, port=8001).port == 8001
    with pytest.raises(ValueError, match="on port 9000"):
        find_stack(tmp_path, port=9000)


def test_a_half_written_or_foreign_file_is_skipped(tmp_path: Path):
    (tmp_path / "stack-8000.json").write_text('{"pid": ')
    (tmp_path / "stack-8001.json").write_text('{"something": "else"}')
    write_stack(info(8002), tmp_path)
    assert [stack.port for stack in running_stacks(tmp_path)] == [8002]
