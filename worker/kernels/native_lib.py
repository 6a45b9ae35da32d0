"""The native kernels' library, loaded once a process, and typed calls into it over tensors.

ctypes costs ~1-2 us a call; a SmolLM2 step makes ~120 of them (four linears a layer and the
head), well under the time they save. Arguments are tensors' data pointers: every tensor passed
here must be contiguous, on the CPU, of the dtype named in the trailing comment.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from worker.kernels.build import built_library, find_compiler
from worker.kernels.cpu_features import ISA_CODES, KernelChoice, choose_kernels, cpu_flags

logger = logging.getLogger(__name__)
QK = 32  # values per quantization block, along the input dimension
TILE = 16  # output rows per packed tile

_P = ctypes.c_void_p
_I = ctypes.c_int


RESIDUAL_STEPS = 254  # a two-term block: x ~= scale * (254 q + residual), native/quant_dot.c


@dataclass(slots=True)
class QuantizedRows:
    """Activations quantized per block of 32: x[t, k] ~= q[t, k] * scales[t, k // 32], or with a
    residual term x[t, k] ~= (254 q[t, k] + residual[t, k]) * scales[t, k // 32] (16-bit precision)."""

    q: torch.Tensor  # [rows, k] int8
    residual: torch.Tensor | None  # [rows, k] int8, the second term, or None
    scales: torch.Tensor  # [rows, k / 32] float32
    sums: torch.Tensor  # [rows, k / 32] int32, each block's sum of its (combined) q

    def dequantize(self) -> torch.Tensor:
        rows, k = self.q.shape
        q = self.q.to(torch.int32)
        if self.residual is not None:
            q = q * RESIDUAL_STEPS + self.residual.to(torch.int32)
        return (q.view(rows, k // QK, QK).to(torch.float32) * self.scales[..., None]).view(rows, k)


class NativeKernels:
    def __init__(self, library: Path, isa: str):
        self.lib = ctypes.CDLL(str(library))
        if isa not in ISA_CODES:
            raise ValueError(f"isa={isa!r}: choose from {', '.join(ISA_CODES)}")
        if not self.supports(isa):  # the C side's own check: never run an instruction the CPU lacks
            raise UnsupportedPathError(f"isa={isa!r}: this CPU (or this build) does not run that path")
        self.isa = isa
        self._isa_code = ISA_CODES[isa]
        self.lib.arbor_quantize_rows.argtypes = [_P, _I, _I, _P, _P, _P, _P, _I]
        self.lib.arbor_quantize_rows.restype = None
        self.lib.arbor_quant_matmul.argtypes = [_P, _I, _P, _P, _P, _P, _I, _I, _I, _P, _I, _I]
        self.lib.arbor_quant_matmul.restype = None
        self.q4_record_bytes = self.lib.arbor_q4_record_bytes()
        self.q8_record_bytes = self.lib.arbor_q8_record_bytes()

    def supports(self, isa: str) -> bool:
        """Whether this CPU runs path `isa` and this library has it (asked of the C side)."""
        return bool(self.lib.arbor_cpu_supports(ISA_CODES[isa]))

    def runnable_paths(self) -> list[str]:
        return [isa for isa in ISA_CODES if self.supports(isa)]

    def quantize_rows(self, x: torch.Tensor, two_term: bool = True) -> QuantizedRows:
        """x [rows, k] float32 contiguous, k a multiple of 32."""
        rows, k = x.shape
        assert x.dtype == torch.float32 and x.is_contiguous() and k % QK == 0, (x.dtype, x.shape)
        q = torch.empty(rows, k, dtype=torch.int8)
        residual = torch.empty(rows, k, dtype=torch.int8) if two_term else None
        scales = torch.empty(rows, k // QK, dtype=torch.float32)
        sums = torch.empty(rows, k // QK, dtype=torch.int32)
        self.lib.arbor_quantize_rows(
            x.data_ptr(),
            rows,
            k,
            q.data_ptr(),
            None if residual is None else residual.data_ptr(),
            scales.data_ptr(),
            sums.data_ptr(),
            self._isa_code,
        )
        return QuantizedRows(q, residual, scales, sums)

    def matmul(self, packed: torch.Tensor, bits: int, rows: QuantizedRows, n: int, threads: int = 1) -> torch.Tensor:
        """[rows, n] float32: the quantized rows times a weight packed by packing.py (`bits` 4 or 8)."""
        num_rows, k = rows.q.shape
        out = torch.empty(num_rows, n, dtype=torch.float32)
        self.lib.arbor_quant_matmul(
            packed.data_ptr(),
            bits,
            rows.q.data_ptr(),
            None if rows.residual is None else rows.residual.data_ptr(),
            rows.scales.data_ptr(),
            rows.sums.data_ptr(),
            num_rows,
            k,
            n,
            out.data_ptr(),
            self._isa_code,
            threads,
        )
        return out


@cache
def kernel_choice(requested: str = "auto", isa: str = "auto") -> KernelChoice:
    """What this machine runs for `requested` (auto|native|native-int8|torch) and `isa` (auto or a
    path to force); logged once per process."""
    choice = choose_kernels(requested, cpu_flags(), find_compiler(), isa)
    if choice.kernels == "native":
        try:  # the library's own check narrows the choice (a compiler too old for a path builds none)
            built = load_kernels("portable").runnable_paths()
            choice = choose_kernels(requested, cpu_flags(), find_compiler(), isa, built)
            load_kernels(choice.isa or "portable")
        except Exception as error:  # a failed build or load: serve with torch, say why in one line
            choice = KernelChoice("torch", None, f"native kernels unavailable: {error}")
    logger.info("linear kernels: %s", choice.describe())
    return choice


@cache
def load_kernels(isa: str) -> NativeKernels:
    """The kernels on path `isa` (any path this CPU runs); raises UnsupportedPathError for others."""
    compiler = find_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc/clang) to build the native kernels")
    return NativeKernels(built_library(compiler), isa)


class UnsupportedPathError(RuntimeError):
    pass
