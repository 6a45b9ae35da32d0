"""Which kernels a worker runs, decided from the CPU's features: a torch-free pure function.

The native kernels (native/quant_dot*.c) have one path per instruction set, every one computing the
portable C path's bits (the same integer dot products, the same float operations in the same
order): AVX-512 VNNI (Intel since Cascade Lake, AMD since Zen 4), AVX-VNNI (Alder Lake and later
without AVX-512), AVX2 with FMA and F16C (Haswell, AMD since Zen 1), and NEON with dot products
(Graviton 2 and later, Ampere, Apple M1 and later). The portable path is ~50x slower than any of
them, slower than PyTorch's own weight-only kernels, so `auto` (the default) picks native wherever
a vector path runs and torch elsewhere; the portable path is there for tests and for a
`--kernels native` that insists. `isa` forces a path (tests, benchmarks: ARBOR_KERNEL_ISA).

Worked example: flags {"avx2", "fma", "f16c"} (a Zen 3) with a compiler -> KernelChoice("native",
"avx2"); the same flags without a compiler -> ("torch", None, "no C compiler: ..."); flags {} ->
torch under auto, ("native", "portable") under native.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# native-int8: activations in one int8 term per block (llama.cpp's Q8 rule: faster at many rows,
# further from float32) instead of two (16-bit precision); see native/quant_dot.c
KERNEL_CHOICES = ("auto", "native", "native-int8", "torch")
# the `isa` argument of the C entry points (native/quant_dot.h)
ISA_CODES = {"portable": 0, "avx512_vnni": 1, "avx2": 2, "avx_vnni": 3, "neon_dotprod": 4}
# each vector path and the features it needs as Linux names them (x86 `flags`, ARM `Features`),
# fastest first: the first one a CPU has wins
ISA_FLAGS = {
    "avx512_vnni": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"}),
    "avx_vnni": frozenset({"avx_vnni", "avx2", "fma", "f16c"}),
    "avx2": frozenset({"avx2", "fma", "f16c"}),
    "neon_dotprod": frozenset({"asimddp"}),
}
VNNI_FLAGS = ISA_FLAGS["avx512_vnni"]
ISA_CHOICES = ("auto", *ISA_CODES)  # what `isa` may force; auto: the fastest this CPU runs


@dataclass(frozen=True, slots=True)
class KernelChoice:
    kernels: str  # "native" or "torch"
    isa: str | None  # the native path (a key of ISA_CODES); None for torch
    reason: str  # one line for the start-up log
    activations: str = "int16"  # native activations: "int16" (two int8 terms) or "int8"

    def describe(self) -> str:
        if self.kernels == "torch":
            return f"torch kernels (aten): {self.reason}"
        return f"native kernels ({self.isa}, {self.activations} activations): {self.reason}"


def runnable_isas(flags: Collection[str], built: Collection[str] | None = None) -> list[str]:
    """The paths a CPU with these flags runs, fastest first; "portable" always, last. `built`: the
    paths the library has (None: all; an older compiler builds no AVX-VNNI path)."""
    have = set(flags)
    found = [isa for isa, needed in ISA_FLAGS.items() if needed <= have and (built is None or isa in built)]
    return [*found, "portable"]


def best_isa(flags: Collection[str], built: Collection[str] | None = None) -> str:
    return runnable_isas(flags, built)[0]


def choose_kernels(
    requested: str,
    flags: Collection[str],
    compiler: str | None,
    isa: str = "auto",
    built: Collection[str] | None = None,
) -> KernelChoice:
    """`requested` is one of KERNEL_CHOICES; `compiler` the C compiler found (None: none); `isa`
    one of ISA_CHOICES; `built` as runnable_isas takes it. A forced `isa` this CPU (or build)
    cannot run is refused, naming what it lacks."""
    if requested not in KERNEL_CHOICES:
        raise ValueError(f"kernels={requested!r}: choose from {', '.join(KERNEL_CHOICES)}")
    if isa not in ISA_CHOICES:
        raise ValueError(f"kernel isa={isa!r}: choose from {', '.join(ISA_CHOICES)}")
    if requested == "torch":
        return KernelChoice("torch", None, "asked for")
    if compiler is None:
        return KernelChoice("torch", None, "no C compiler (cc/gcc/clang) to build the native kernels")
    activations = "int8" if requested == "native-int8" else "int16"
    if isa != "auto":
        if isa not in runnable_isas(flags, built):
            missing = ", ".join(sorted(ISA_FLAGS[isa] - set(flags))) or "nothing: the library was built without it"
            raise ValueError(f"kernel isa={isa!r}: this CPU lacks {missing}")
        return KernelChoice("native", isa, "path forced (--kernel-isa, ARBOR_KERNEL_ISA)", activations)
    chosen = best_isa(flags, built)
    if chosen == "portable" and requested == "auto":
        return KernelChoice("torch", None, "no vector path for this CPU (" + _vector_paths() + ")")
    features = ", ".join(sorted(ISA_FLAGS.get(chosen, frozenset()) & set(flags))) or "none"
    return KernelChoice("native", chosen, f"CPU features {features}", activations)


def _vector_paths() -> str:
    return "; ".join(f"{isa}: {' '.join(sorted(needed))}" for isa, needed in ISA_FLAGS.items())


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's features as Linux names them: x86's `flags` line, ARM's `Features`
    (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()
