"""The fused native layers (native/fused_layers.c) give the portable C path's bits on every vector
path this machine runs (AVX-512, AVX2, AVX-VNNI's float kernels; NEON on an aarch64 host), on one
thread and two, for decode rows of several lanes, a chain, a tree beside a decode lane, and a
prefill chunk; tiny random Qwen3 (q/k norms) and Qwen2 (q/k/v bias, head_dim 32) models in the
int4 native format. On an x86 host with the aarch64 cross compiler and qemu, an aarch64 build of
the kernels (fused_driver.c) gives the host's portable bytes on its NEON and portable paths.
"""

from __future__ import annotations

import functools
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.support.tiny_drafters import speculation_checkpoints
from tests.support.tiny_models import make_tiny_model
from worker.kernels.build import FLAGS, SOURCES, find_compiler
from worker.kernels.cpu_features import ISA_CODES, ISA_FLAGS, cpu_flags
from worker.kernels.fused_layers import FusedLayers, RowTables, fusable, max_query_heads_per_kv_head
from worker.kernels.native_lib import UnsupportedPathError, load_kernels
from worker.models.loader import LoadedModel, load_model

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C compiler for the native kernels")

VECTOR_PATHS = [isa for isa, flags in ISA_FLAGS.items() if flags <= cpu_flags()]  # the paths this CPU runs


@dataclass(slots=True)
class Lane:
    start: int  # committed keys
    num_rows: int
    tree: torch.Tensor | None = None  # [rows, rows] bool


# a tree of 7 nodes: root 0; 1, 2 under 0; 3 under 1; 4, 5 under 2; 6 under 4
PARENTS = (-1, 0, 0, 1, 2, 2, 4)


def tree_mask(parents: tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(len(parents), len(parents), dtype=torch.bool)
    for node in range(len(parents)):
        ancestor = node
        while ancestor >= 0:
            mask[node, ancestor] = True
            ancestor = parents[ancestor]
    return mask


CASES = {
    "decode rows": [Lane(5, 1), Lane(37, 1), Lane(0, 1), Lane(16, 1)],
    "chain": [Lane(20, 6)],
    "tree beside a decode lane": [Lane(33, 7, tree_mask(PARENTS)), Lane(11, 1)],
    "prefill chunk": [Lane(17, 40)],
    "verification after 70 keys": [Lane(70, 4), Lane(3, 2)],
}


# the random models' shapes beside the qwen3 checkpoint
SHAPES = {
    # q/k/v bias, two 32-wide heads: the vector loops run more than once a head
    "qwen2": dict(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1),
    # 80-wide heads (64 dims a pass, then 16), three query heads a kv head
    "llama": dict(num_hidden_layers=1, hidden_size=480, num_attention_heads=6, num_key_value_heads=2, head_dim=80),
}


@functools.cache
def model(family: str) -> LoadedModel:
    if family == "qwen3":
        folder = speculation_checkpoints("qwen3").target
    else:
        folder = make_tiny_model(Path(tempfile.mkdtemp(prefix="arbor-fused-isa-")) / family, family, **SHAPES[family])
    return load_model(folder, dtype="auto", quantize="int4", kernels="native")


def fused_layers(family: str, isa: str, threads: int) -> FusedLayers:
    loaded = model(family)
    formats = loaded.formats
    assert formats is not None and formats.kernels == "native"
    kernels = load_kernels(formats.native_isa or "portable")
    index = formats.formats.index(formats.body)
    return FusedLayers(loaded.decoder, kernels, index, two_term=True, threads=threads, isa=isa)


@dataclass(slots=True)
class Inputs:
    x: torch.Tensor  # [rows, hidden]
    cos: torch.Tensor  # [rows, head_dim]
    sin: torch.Tensor
    keys: torch.Tensor  # [layers, kv_heads, slots, head_dim]
    values: torch.Tensor
    tables: RowTables


def inputs(family: str, lanes: list[Lane]) -> Inputs:
    """Random rows and a random K/V storage, each lane's slots scattered through it."""
    config = model(family).config
    generator = torch.Generator().manual_seed(7)
    num_rows = sum(lane.num_rows for lane in lanes)
    num_slots = sum(lane.start + lane.num_rows for lane in lanes) + 5
    storage = (config.num_hidden_layers, config.num_key_value_heads, num_slots, config.head_dim)
    order = torch.randperm(num_slots, generator=generator).to(torch.int32)
    lane_slots, used = [], 0
    for lane in lanes:
        lane_slots.append(order[used : used + lane.start + lane.num_rows])
        used += lane.start + lane.num_rows
    return Inputs(
        torch.randn(num_rows, config.hidden_size, generator=generator),
        torch.rand(num_rows, config.head_dim, generator=generator) * 2 - 1,
        torch.rand(num_rows, config.head_dim, generator=generator) * 2 - 1,
        torch.randn(storage, generator=generator),
        torch.randn(storage, generator=generator),
        RowTables.build(lanes, lane_slots, [lane.tree for lane in lanes]),
    )


def run(family: str, isa: str, threads: int, lanes: list[Lane]) -> dict[str, torch.Tensor]:
    """One fused forward; everything it wrote."""
    given = inputs(family, lanes)
    hidden = {0: torch.empty_like(given.x)}
    layers = fused_layers(family, isa, threads)
    layers.forward(given.x, given.cos, given.sin, given.tables, given.keys, given.values, hidden)
    return {"x": given.x, "keys": given.keys, "values": given.values, "hidden after layer 0": hidden[0]}


def assert_same_bits(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name, tensor in expected.items():
        assert torch.equal(got[name].view(torch.int32), tensor.view(torch.int32)), name


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_every_vector_path_gives_the_portable_paths_bits(family: str, case: str) -> None:
    if not VECTOR_PATHS:
        pytest.skip("this CPU runs no vector path")
    expected = run(family, "portable", 1, CASES[case])
    for isa in VECTOR_PATHS:
        for threads in (1, 2):
            assert_same_bits(run(family, isa, threads, CASES[case]), expected)


def test_the_compared_forward_moves_every_row_and_writes_only_the_new_keys() -> None:
    lanes = CASES["tree beside a decode lane"]
    before, after = inputs("qwen3", lanes), run("qwen3", "portable", 1, lanes)
    config = model("qwen3").config
    assert torch.isfinite(after["x"]).all() and (after["x"] != before.x).any(dim=1).all()
    written = (after["keys"] != before.keys).any(dim=-1)  # [layers, kv_heads, slots]
    assert written.sum() == config.num_hidden_layers * config.num_key_value_heads * (7 + 1)


@pytest.mark.parametrize("isa", [isa for isa in ISA_CODES if isa != "portable" and isa not in VECTOR_PATHS])
def test_a_path_this_cpu_lacks_is_refused_by_name(isa: str) -> None:
    """Another architecture's path, or one this CPU lacks (AVX-VNNI on a Zen 4): refused, never run."""
    with pytest.raises(UnsupportedPathError, match=isa):
        fused_layers("qwen3", isa, 1)


DRIVER = Path(__file__).parent / "fused_driver.c"
EXECUTABLE_FLAGS = [flag for flag in FLAGS if flag not in ("-shared", "-fPIC")]
QEMU = ["qemu-aarch64", "-cpu", "neoverse-n1"]  # an aarch64 core with dotprod
needs_x86 = pytest.mark.skipif(platform.machine() != "x86_64", reason="cross-checks aarch64 from an x86 host")


def build_driver(compiler: str, output: Path, *extra: str) -> Path:
    sources = [str(DRIVER), *(str(path) for path in SOURCES)]
    subprocess.run([compiler, *EXECUTABLE_FLAGS, *extra, "-o", str(output), *sources, "-lm"], check=True, timeout=300)
    return output


@functools.cache
def aarch64_driver() -> Path:
    compiler = shutil.which("aarch64-linux-gnu-gcc")
    if compiler is None:
        pytest.skip("no aarch64 cross compiler (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross)")
    folder = Path(tempfile.mkdtemp(prefix="arbor-fused-arm-"))
    return build_driver(compiler, folder / "fused_driver", "-static")


def driver_bytes(command: list[str], isa: int, threads: int) -> bytes:
    return subprocess.run([*command, str(isa), str(threads)], capture_output=True, check=True, timeout=300).stdout


@needs_x86
def test_the_fused_layers_build_for_aarch64() -> None:
    assert aarch64_driver().stat().st_size > 0


@needs_x86
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="no qemu-aarch64 (apt-get install qemu-user)")
def test_an_aarch64_build_gives_the_host_portable_paths_bytes(tmp_path: Path) -> None:
    compiler = find_compiler()
    assert compiler is not None
    expected = driver_bytes([str(build_driver(compiler, tmp_path / "fused_driver"))], 0, 1)
    arm = [*QEMU, str(aarch64_driver())]
    for isa, threads in ((4, 1), (4, 2), (0, 1)):  # NEON on one thread and two, portable
        assert driver_bytes(arm, isa, threads) == expected, (isa, threads)


@needs_x86
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="no qemu-aarch64 (apt-get install qemu-user)")
def test_an_aarch64_build_gives_them_at_smollm2s_shape(tmp_path: Path) -> None:
    """64-wide heads, three query heads a kv head, 1,024 keys: attention's full passes of 16 keys and
    64 dims, which the small shape's 32-wide heads and short lanes do not reach."""
    compiler = find_compiler()
    assert compiler is not None
    host = [str(build_driver(compiler, tmp_path / "fused_driver"))]
    expected = subprocess.run([*host, "0", "1", "1", "smollm2"], capture_output=True, check=True, timeout=300).stdout
    arm = [*QEMU, str(aarch64_driver()), "4", "1", "1", "smollm2"]
    assert subprocess.run(arm, capture_output=True, check=True, timeout=300).stdout == expected


def test_a_group_wider_than_a_tile_takes_the_per_op_path() -> None:
    if not VECTOR_PATHS:
        pytest.skip("this CPU runs no vector path")
    kernels = load_kernels(VECTOR_PATHS[0])
    shape = dict(hidden_size=64 * 32, intermediate_size=128, head_dim=32, num_key_value_heads=1)
    assert max_query_heads_per_kv_head(kernels) == 48
    assert fusable(SimpleNamespace(**shape, num_attention_heads=48), kernels)
    assert not fusable(SimpleNamespace(**shape, num_attention_heads=64), kernels)
