"""Which kernels a worker runs is a function of the CPU's features and a compiler: fixed feature sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.kernels.cpu_features import ISA_CODES, choose_kernels, cpu_flags, runnable_isas

# /proc/cpuinfo flags (x86) and Features (ARM), the parts that matter, as Linux prints them
ZEN3 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
ZEN4 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"}
ICE_LAKE = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
ALDER_LAKE = ZEN3 | {"avx_vnni"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl"}  # AVX-512 without VNNI: the AVX2 path
SANDY_BRIDGE = frozenset({"sse4_2", "avx"})  # no vector path
GRAVITON2 = frozenset({"fp", "asimd", "aes", "crc32", "atomics", "asimdrdm", "lrcpc", "dcpop", "asimddp"})
GRAVITON3 = GRAVITON2 | {"sve", "i8mm", "bf16", "asimdfhm"}
APPLE_M1 = frozenset({"fp", "asimd", "fphp", "asimdhp", "asimdrdm", "lrcpc", "asimddp", "asimdfhm"})
CORTEX_A72 = frozenset({"fp", "asimd", "aes", "crc32"})  # Raspberry Pi 4, Graviton 1: no dotprod

EXPECTED = [
    (ZEN3, "avx2"),
    (ZEN4, "avx512_vnni"),
    (ICE_LAKE, "avx512_vnni"),
    (ALDER_LAKE, "avx_vnni"),
    (SKYLAKE_X, "avx2"),
    (GRAVITON2, "neon_dotprod"),
    (GRAVITON3, "neon_dotprod"),
    (APPLE_M1, "neon_dotprod"),
]


@pytest.mark.parametrize(("flags", "isa"), EXPECTED)
def test_auto_runs_native_on_the_fastest_vector_path(flags: frozenset[str], isa: str) -> None:
    choice = choose_kernels("auto", flags, "/usr/bin/cc")
    assert (choice.kernels, choice.isa) == ("native", isa)
    assert isa in choice.describe()


@pytest.mark.parametrize("flags", [SANDY_BRIDGE, CORTEX_A72, frozenset()])
def test_no_vector_path_means_torch_by_default_and_portable_when_asked(flags: frozenset[str]) -> None:
    choice = choose_kernels("auto", flags, "/usr/bin/cc")
    assert choice.kernels == "torch" and "no vector path" in choice.reason
    assert (choose_kernels("native", flags, "cc").kernels, choose_kernels("native", flags, "cc").isa) == (
        "native",
        "portable",
    )


def test_a_cpu_runs_every_path_its_flags_allow_fastest_first() -> None:
    assert runnable_isas(ZEN4) == ["avx512_vnni", "avx2", "portable"]
    assert runnable_isas(ALDER_LAKE) == ["avx_vnni", "avx2", "portable"]
    assert runnable_isas(GRAVITON3) == ["neon_dotprod", "portable"]
    assert runnable_isas(ALDER_LAKE - {"f16c"}) == ["portable"]  # the AVX2 paths convert fp16 scales with F16C


def test_a_path_can_be_forced_where_the_cpu_runs_it() -> None:
    assert choose_kernels("auto", ZEN4, "cc", isa="avx2").isa == "avx2"
    assert choose_kernels("native-int8", ZEN4, "cc", isa="portable").activations == "int8"
    assert choose_kernels("torch", ZEN4, "cc", isa="avx2").kernels == "torch"
    with pytest.raises(ValueError, match="'avx_vnni': this CPU lacks avx_vnni"):
        choose_kernels("auto", ZEN4, "cc", isa="avx_vnni")
    with pytest.raises(ValueError, match="isa='sse'"):
        choose_kernels("auto", ZEN4, "cc", isa="sse")


def test_no_compiler_means_torch_with_the_reason() -> None:
    for flags in (ZEN4, ZEN3, GRAVITON2):
        choice = choose_kernels("native", flags, None)
        assert choice.kernels == "torch" and "compiler" in choice.reason


def test_torch_when_asked_and_a_bad_name_refused() -> None:
    assert choose_kernels("torch", ZEN4, "cc").kernels == "torch"
    with pytest.raises(ValueError, match="kernels='fast'"):
        choose_kernels("fast", ZEN4, "cc")


def test_isa_codes_are_the_c_sides() -> None:
    header = (Path(__file__).parents[3] / "worker" / "kernels" / "native" / "quant_dot.h").read_text()
    for isa, code in ISA_CODES.items():
        assert f"ISA_{isa.upper()} = {code}" in header


def test_flags_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n\nprocessor\t: 1\nflags\t: fpu\n")
    assert cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512f", "avx512_vnni"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_arm_features_are_read_from_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
        "asimdhp cpuid asimdrdm lrcpc dcpop asimddp\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    )
    flags = cpu_flags(cpuinfo)
    assert "asimddp" in flags and "fp" in flags and choose_kernels("auto", flags, "cc").isa == "neon_dotprod"


def test_a_path_the_library_lacks_falls_to_the_next_one() -> None:
    built_without_avx_vnni = ("portable", "avx2", "avx512_vnni")  # gcc before 11 builds no AVX-VNNI path
    assert choose_kernels("auto", ALDER_LAKE, "cc", built=built_without_avx_vnni).isa == "avx2"
    assert choose_kernels("auto", GRAVITON2, "cc", built=("portable",)).kernels == "torch"
    with pytest.raises(ValueError, match="built without it"):
        choose_kernels("auto", ALDER_LAKE, "cc", isa="avx_vnni", built=built_without_avx_vnni)
