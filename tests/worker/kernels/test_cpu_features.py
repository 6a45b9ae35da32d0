"""Which kernels a worker runs is a function of the CPU's features and a compiler: fixed feature sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.kernels.cpu_features import VNNI_FLAGS, choose_kernels, cpu_flags

ZEN4 = VNNI_FLAGS | {"avx2", "avx512_bf16", "avx512dq"}
XEON_ICELAKE = VNNI_FLAGS | {"avx2", "avx512dq"}
AVX2_ONLY = frozenset({"avx", "avx2", "fma", "f16c"})
AVX512_NO_VNNI = frozenset({"avx2", "avx512f", "avx512bw", "avx512vl"})  # Skylake-X


@pytest.mark.parametrize("flags", [ZEN4, XEON_ICELAKE])
def test_vnni_cpus_run_native_by_default(flags: frozenset[str]) -> None:
    choice = choose_kernels("auto", flags, "/usr/bin/cc")
    assert (choice.kernels, choice.isa) == ("native", "avx512_vnni")


@pytest.mark.parametrize("flags", [AVX2_ONLY, AVX512_NO_VNNI, frozenset()])
def test_cpus_without_vnni_keep_torch_by_default_and_portable_when_asked(flags: frozenset[str]) -> None:
    assert choose_kernels("auto", flags, "/usr/bin/cc").kernels == "torch"
    assert (choose_kernels("native", flags, "/usr/bin/cc").kernels, choose_kernels("native", flags, "cc").isa) == (
        "native",
        "portable",
    )


def test_no_compiler_means_torch_with_the_reason() -> None:
    choice = choose_kernels("native", ZEN4, None)
    assert choice.kernels == "torch" and "compiler" in choice.reason


def test_torch_when_asked_and_a_bad_name_refused() -> None:
    assert choose_kernels("torch", ZEN4, "cc").kernels == "torch"
    with pytest.raises(ValueError, match="kernels='fast'"):
        choose_kernels("fast", ZEN4, "cc")


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512f", "avx512_vnni"}
    assert cpu_flags(tmp_path / "missing") == frozenset()
