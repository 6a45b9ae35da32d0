"""Builds native/*.c into one shared library at first use, cached by the source's hash.

Why at first use and not at install: the wheel stays pure Python (the gateway image needs no
compiler), and a library built on the machine that runs it needs no cross-CPU care (each vector
path's functions carry their own target attributes, so the build needs no -march and runs on any
CPU of its architecture; which path runs is decided at run time, native_lib.py). The build
takes about a second with gcc or clang; a machine without a compiler serves with PyTorch's
kernels (cpu_features.choose_kernels). Concurrent workers may build at once: each writes its own
temporary file and renames it into place.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)
NATIVE = Path(__file__).parent / "native"
# a file a path (quant_dot.c: the portable one, dispatch and entry points); the tests cross-compile these
QUANT_DOT_SOURCES = tuple(
    NATIVE / f"{name}.c" for name in ("quant_dot", "quant_dot_avx512", "quant_dot_avx2", "quant_dot_neon")
)
SOURCES = (*QUANT_DOT_SOURCES, NATIVE / "fused_layers.c")
HEADERS = (NATIVE / "quant_dot.h", NATIVE / "quant_dot_ymm.h")  # in the cache key; included, not compiled alone
# -ffp-contract=off: the portable path's float sums must be the fmaf calls written, no others fused
FLAGS = ("-O3", "-shared", "-fPIC", "-std=c11", "-ffp-contract=off", "-fno-math-errno", "-pthread")
COMPILE_TIMEOUT_S = 120


def find_compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path is not None:
            return path
    return None


def default_cache_dir() -> Path:
    home_cache = Path.home() / ".cache" / "arbor" / "kernels"
    try:
        home_cache.mkdir(parents=True, exist_ok=True)
        return home_cache
    except OSError:
        return Path(tempfile.gettempdir()) / f"arbor-kernels-{os.getuid()}"


def built_library(compiler: str, cache_dir: Path | None = None, defines: tuple[str, ...] = ()) -> Path:
    """The library's path, built now if this source has not been built before. `defines` (NAME or
    NAME=VALUE) make the tests' build variants. Raises `KernelBuildError` with the compiler's
    message when the build fails."""
    source = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    flags = (*FLAGS, *(f"-D{define}" for define in defines))
    digest = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:16]
    folder = cache_dir or default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"arbor_quant_dot-{digest}.so"
    if library.exists():
        return library
    fd, partial = tempfile.mkstemp(dir=folder, suffix=".so.partial")
    os.close(fd)
    command = [compiler, *flags, "-o", partial, *(str(path) for path in SOURCES), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    if result.returncode != 0:
        os.unlink(partial)
        raise KernelBuildError(f"{' '.join(command)} failed: {result.stderr.strip()[:2000]}")
    os.replace(partial, library)
    logger.info("built native kernels %s with %s", library, compiler)
    return library


class KernelBuildError(RuntimeError):
    pass
