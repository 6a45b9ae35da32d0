"""The kernels on CPUs this machine is not, under qemu: quant_dot*.c cross-compiled for aarch64 with
neon_driver.c, run as a Neoverse N1 (dot products: the neon_dotprod path) and as a Cortex-A53 (none:
the library must pick the portable path, not die of SIGILL), computes the host portable path's bits
for the same inputs; so does the x86 build run as a Westmere (no AVX: portable) and as qemu's
`max` CPU (AVX2 without AVX-512: the avx2 path).

Needs Debian's qemu-user, gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (`make ci-tools`)."""

from __future__ import annotations

import platform
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
import torch

from worker.kernels.build import FLAGS, QUANT_DOT_SOURCES
from worker.kernels.cpu_features import ISA_CODES
from worker.kernels.native_lib import NativeKernels, QuantizedRows, load_kernels
from worker.kernels.packing import pack_int4, pack_int8
from worker.kernels.quantized_weight import Int4Weight, Int8Weight

CROSS_COMPILER, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", Path("/usr/aarch64-linux-gnu")
QEMU_X86 = "qemu-x86_64"
DRIVER = Path(__file__).parent / "neon_driver.c"
RUN_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(
    shutil.which(CROSS_COMPILER) is None or shutil.which(QEMU) is None or not (SYSROOT / "lib").is_dir(),
    reason="no aarch64 cross toolchain or qemu-aarch64: apt-get install qemu-user gcc-aarch64-linux-gnu "
    "libc6-dev-arm64-cross (make ci-tools)",
)

Case = tuple[int, bool, Int4Weight | Int8Weight, torch.Tensor]  # bits, two_term, weight, x [rows, k]


EXECUTABLE_FLAGS = [flag for flag in FLAGS if flag not in ("-shared", "-fPIC")]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    binary = tmp_path_factory.mktemp("neon") / "neon_driver"
    command = [CROSS_COMPILER, *EXECUTABLE_FLAGS, "-o", str(binary), str(DRIVER), *map(str, QUANT_DOT_SOURCES), "-lm"]
    subprocess.run(command, check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    return binary


def clang_driver(clang: str, folder: Path) -> Path:
    """The driver compiled by clang for aarch64 (linked by the cross gcc, which knows the sysroot)."""
    objects = []
    for source in (DRIVER, *QUANT_DOT_SOURCES):
        objects.append(str(folder / f"{source.stem}.o"))
        command = [clang, "--target=aarch64-linux-gnu", *EXECUTABLE_FLAGS, "-c", str(source), "-o", objects[-1]]
        subprocess.run(command, check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    binary = folder / "neon_driver_clang"
    subprocess.run([CROSS_COMPILER, "-pthread", "-o", str(binary), *objects, "-lm"], check=True, timeout=RUN_TIMEOUT_S)
    return binary


def cases() -> list[Case]:
    """Q4_0, Q4_1 and Q8_0 with one- and two-term activations; n < 16, odd tiles, 1-17 rows; one
    Q4 case at the ends of every range (all-15 nibbles, -128 bytes, zero blocks, +-amax inputs)."""
    gen = torch.Generator().manual_seed(11)
    found: list[Case] = []
    for n, k, rows in ((5, 32, 1), (17, 64, 3), (40, 96, 17), (33, 576, 4)):
        scales = (torch.rand(n, k // 32, generator=gen) * 0.1).half().float()
        mins = (torch.randn(n, k // 32, generator=gen) * 0.3).half().float()
        q4 = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        q8 = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        x = torch.randn(rows, k, generator=gen) * 4
        for two_term in (True, False):
            found.append((4, two_term, Int4Weight(q4, scales, -8 * scales), x))
            found.append((4, two_term, Int4Weight(q4, scales, mins), x))
            found.append((8, two_term, Int8Weight(q8, scales, 32), x))
    scales = torch.full((16, 3), 0.5)
    scales[:, 1] = 0.0
    edge_x = torch.where(torch.arange(96) % 3 == 0, 9.0, -9.0).expand(2, 96).contiguous()
    for two_term in (True, False):
        found.append((4, two_term, Int4Weight(torch.full((16, 96), 15, dtype=torch.uint8), scales, scales), edge_x))
        found.append((8, two_term, Int8Weight(torch.full((16, 96), -128, dtype=torch.int8), scales, 32), edge_x))
    return found


def packed(bits: int, weight: Int4Weight | Int8Weight) -> torch.Tensor:
    return pack_int4(weight) if isinstance(weight, Int4Weight) else pack_int8(weight)


def run_driver(driver: Path, cpu: str, all_cases: list[Case], folder: Path, qemu: list[str] | None = None) -> bytes:
    inputs, outputs = folder / f"{cpu}.in", folder / f"{cpu}.out"
    with inputs.open("wb") as file:
        for bits, two_term, weight, x in all_cases:
            weight_bytes = packed(bits, weight).numpy().tobytes()
            rows, k = x.shape
            file.write(struct.pack("<6i", bits, int(two_term), rows, k, weight.shape[0], len(weight_bytes)))
            file.write(weight_bytes + x.numpy().tobytes())
    command = [*(qemu or [QEMU, "-L", str(SYSROOT)]), "-cpu", cpu, str(driver), str(inputs), str(outputs)]
    subprocess.run(command, check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    return outputs.read_bytes()


def host_portable_bytes(portable: NativeKernels, bits: int, two_term: bool, weight, x: torch.Tensor) -> bytes:
    rows: QuantizedRows = portable.quantize_rows(x, two_term)
    out = portable.matmul(packed(bits, weight), bits, rows, weight.shape[0])
    parts = [rows.q, *([rows.residual] if rows.residual is not None else []), rows.scales, rows.sums, out]
    return b"".join(part.numpy().tobytes() for part in parts)


@pytest.mark.parametrize(("cpu", "isa"), [("neoverse-n1", "neon_dotprod"), ("cortex-a53", "portable")])
def test_aarch64_computes_the_host_portable_bits(driver: Path, tmp_path: Path, cpu: str, isa: str) -> None:
    assert_host_portable_bits(run_driver(driver, cpu, cases(), tmp_path), isa)


def test_a_clang_build_computes_them_too(clang: str, tmp_path: Path) -> None:
    assert_host_portable_bits(
        run_driver(clang_driver(clang, tmp_path), "neoverse-n1", cases(), tmp_path), "neon_dotprod"
    )


@pytest.mark.skipif(
    platform.machine() != "x86_64" or shutil.which(QEMU_X86) is None, reason="not x86, or no qemu-x86_64"
)
@pytest.mark.parametrize(("cpu", "isa"), [("Westmere", "portable"), ("max", "avx2")])
def test_x86_cpus_without_avx512_pick_their_path_and_compute_the_same_bits(tmp_path: Path, cpu: str, isa: str) -> None:
    binary = tmp_path / "driver_x86"
    command = ["cc", *EXECUTABLE_FLAGS, "-o", str(binary), str(DRIVER), *map(str, QUANT_DOT_SOURCES), "-lm"]
    subprocess.run(command, check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    assert_host_portable_bits(run_driver(binary, cpu, cases(), tmp_path, [QEMU_X86]), isa)


def assert_host_portable_bits(output: bytes, isa: str) -> None:
    all_cases = cases()
    assert struct.unpack_from("<i", output)[0] == ISA_CODES[isa], "the library chose another path"
    portable = load_kernels("portable")
    at = 4
    for index, (bits, two_term, weight, x) in enumerate(all_cases):
        want = host_portable_bytes(portable, bits, two_term, weight, x)
        assert output[at : at + len(want)] == want, (isa, index, bits, two_term, tuple(x.shape), weight.shape)
        at += len(want)
    assert at == len(output)
