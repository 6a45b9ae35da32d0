"""Builds native/*.c into one shared library at first use, cached by the source's hash.

Why at first use and not at install: the wheel stays pure Python (the gateway image needs no
compiler), and a library built on the machine that runs it needs no cross-CPU care (the AVX-512
functions carry their own target attributes; which path runs is decided at run time). The build
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
SOURCES = (Path(__file__).parent / "native" / "quant_dot.c", Path(__file__).parent / "native" / "fused_layers.c")
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


def built_library(compiler: str, cache_dir: Path | None = None) -> Path:
    """The library's path, built now if this source has not been built before. Raises
    `KernelBuildError` with the compiler's message when the build fails."""
    headers = sorted(SOURCES[0].parent.glob("*.h"))  # included by the sources: a change must rebuild too
    source = b"".join(path.read_bytes() for path in (*SOURCES, *headers))
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    folder = cache_dir or default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"arbor_quant_dot-{digest}.so"
    if library.exists():
        return library
    fd, partial = tempfile.mkstemp(dir=folder, suffix=".so.partial")
    os.close(fd)
    command = [compiler, *FLAGS, "-o", partial, *(str(path) for path in SOURCES), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
    if result.returncode != 0:
        os.unlink(partial)
        raise KernelBuildError(f"{' '.join(command)} failed: {result.stderr.strip()[:2000]}")
    os.replace(partial, library)
    logger.info("built native kernels %s with %s", library, compiler)
    return library


class KernelBuildError(RuntimeError):
    pass
