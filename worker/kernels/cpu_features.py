"""Which kernels a worker runs, decided from the CPU's features: a torch-free pure function.

The native kernels (native/quant_dot.c) have two paths: AVX-512 VNNI (`vpdpbusd`, unsigned x
signed byte dot products into int32: Intel since Cascade Lake, AMD since Zen 4) and portable C
with the same sums in the same order (bitwise the same results, ~50x slower). A CPU without VNNI
is better served by PyTorch's own weight-only kernels than by the portable path, so `auto` (the
default) picks native only where VNNI runs; the portable path is there for tests and for a
`--kernels native` that insists.

Worked example: flags {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} with a compiler ->
KernelChoice("native", "avx512_vnni"); the same flags without a compiler -> ("torch", None,
"no C compiler: ...").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

# native-int8: activations in one int8 term per block (llama.cpp's Q8 rule: faster at many rows,
# further from float32) instead of two (16-bit precision); see native/quant_dot.c
KERNEL_CHOICES = ("auto", "native", "native-int8", "torch")
VNNI_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512_vnni"})
# the `isa` argument of the C entry points
ISA_CODES = {"portable": 0, "avx512_vnni": 1, "avx2": 2, "avx_vnni": 3, "neon_dotprod": 4}


@dataclass(frozen=True, slots=True)
class KernelChoice:
    kernels: str  # "native" or "torch"
    isa: str | None  # the native path ("avx512_vnni", "portable"); None for torch
    reason: str  # one line for the start-up log
    activations: str = "int16"  # native activations: "int16" (two int8 terms) or "int8"

    def describe(self) -> str:
        if self.kernels == "torch":
            return f"torch kernels (aten): {self.reason}"
        return f"native kernels ({self.isa}, {self.activations} activations): {self.reason}"


def best_isa(flags: Collection[str]) -> str:
    return "avx512_vnni" if set(flags) >= VNNI_FLAGS else "portable"


def choose_kernels(requested: str, flags: Collection[str], compiler: str | None) -> KernelChoice:
    """`requested` is auto|native|torch; `compiler` the C compiler found (None: none)."""
    if requested not in KERNEL_CHOICES:
        raise ValueError(f"kernels={requested!r}: choose from {', '.join(KERNEL_CHOICES)}")
    if requested == "torch":
        return KernelChoice("torch", None, "asked for")
    if compiler is None:
        return KernelChoice("torch", None, "no C compiler (cc/gcc) to build the native kernels")
    isa = best_isa(flags)
    if isa == "portable" and requested == "auto":
        return KernelChoice("torch", None, "this CPU lacks AVX-512 VNNI (" + ", ".join(sorted(VNNI_FLAGS)) + ")")
    activations = "int8" if requested == "native-int8" else "int16"
    features = ", ".join(sorted(VNNI_FLAGS & set(flags))) or "none"
    return KernelChoice("native", isa, f"CPU features {features}", activations)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first processor's flags as Linux names them (empty where there is no /proc/cpuinfo)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags") and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()
