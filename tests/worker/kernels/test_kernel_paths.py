"""Every vector path this machine runs computes the portable path's bits: activation quantization,
Q4_0, Q4_1 and Q8_0 products with one- and two-term activations, on edge values and odd shapes;
and a row's result does not depend on its batch or the thread count. Paths the CPU lacks skip, by
its /proc/cpuinfo flags. `avx_vnni-evex` is the AVX-VNNI path's code built on the EVEX form of
`vpdpbusd`, so that a CPU with AVX-512 VNNI but no AVX-VNNI (Zen 4) runs it."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from worker.kernels.build import built_library, find_compiler
from worker.kernels.cpu_features import ISA_CODES, cpu_flags, runnable_isas
from worker.kernels.native_lib import NativeKernels, QuantizedRows, UnsupportedPathError, load_kernels
from worker.kernels.packing import pack_int4, pack_int8
from worker.kernels.quantized_weight import Int4Weight, Int8Weight

VECTOR_PATHS = [isa for isa in ISA_CODES if isa != "portable"] + ["avx_vnni-evex"]
BUILT_HERE = {"x86_64": {"avx512_vnni", "avx2", "avx_vnni"}, "aarch64": {"neon_dotprod"}}.get(platform.machine(), set())
SHAPES = [(5, 32), (16, 32), (17, 64), (40, 160), (133, 1536)]  # (out, in): n < 16, odd tiles, K of 32 and more
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 16, 33, 64]


def path_kernels(name: str, cache_dir: Path) -> NativeKernels:
    flags = cpu_flags()
    if name == "avx_vnni-evex":
        if not {"avx512_vnni", "avx2"} <= set(runnable_isas(flags)):
            pytest.skip("the EVEX build of the AVX-VNNI path needs AVX-512 VNNI")
        compiler = find_compiler()
        assert compiler is not None
        return NativeKernels(built_library(compiler, cache_dir, ("ARBOR_AVX_VNNI_VIA_EVEX",)), "avx_vnni")
    if name not in runnable_isas(flags):
        pytest.skip(f"this CPU lacks the {name} path")
    return load_kernels(name)


@pytest.fixture(scope="module", params=VECTOR_PATHS)
def vector(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> NativeKernels:
    return path_kernels(request.param, tmp_path_factory.mktemp("evex"))


@pytest.fixture(scope="module")
def portable() -> NativeKernels:
    return load_kernels("portable")


def random_weights(n: int, k: int, seed: int) -> list[tuple[int, Int4Weight | Int8Weight]]:
    """Q4_0 (mins -8 d), Q4_1 (any mins) and Q8_0 weights, scales held exactly in fp16."""
    gen = torch.Generator().manual_seed(seed)
    scales = (torch.rand(n, k // 32, generator=gen) * 0.1).half().float()
    mins = (torch.randn(n, k // 32, generator=gen) * 0.3).half().float()
    q4 = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    q8 = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    return [
        (4, Int4Weight(q4, scales, -8 * scales)),
        (4, Int4Weight(q4, scales, mins)),
        (8, Int8Weight(q8, scales, 32)),
    ]


def assert_same_bits(portable: NativeKernels, vector: NativeKernels, weights, rows: QuantizedRows, n: int) -> None:
    for bits, weight in weights:
        packed = pack_int4(weight) if bits == 4 else pack_int8(weight)
        want, got = portable.matmul(packed, bits, rows, n), vector.matmul(packed, bits, rows, n)
        assert torch.equal(want, got), (vector.isa, bits, n, rows.q.shape, (want - got).abs().max())


def test_the_c_side_runs_the_paths_the_cpu_flags_name(portable: NativeKernels) -> None:
    assert set(portable.runnable_paths()) == set(runnable_isas(cpu_flags())) & (BUILT_HERE | {"portable"})


def test_a_path_the_cpu_lacks_is_refused(portable: NativeKernels) -> None:
    missing = [isa for isa in ISA_CODES if not portable.supports(isa)]
    assert missing, "every path runs here: nothing to refuse"
    with pytest.raises(UnsupportedPathError, match=missing[0]):
        load_kernels(missing[0])


@pytest.mark.parametrize("two_term", [True, False])
def test_activations_quantize_to_the_same_bits(portable: NativeKernels, vector: NativeKernels, two_term: bool) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, 256, generator=gen) * torch.tensor([1e-30, 1e-3, 1.0, 7.0, 1e4, 3e30])[:, None]
    x[0, :32] = 0.0  # a zero block
    x[1, 32:64] = torch.where(torch.arange(32) % 2 == 0, 5.0, -5.0)  # every value at +-amax: +-127
    x[2, 64:96] = torch.arange(32) - 15.5  # ties at half steps
    x[3, 96:128] = torch.tensor([-0.0, 1e-38, -1e-38, 2.0] * 8)  # signed zero and subnormals
    want, got = portable.quantize_rows(x, two_term), vector.quantize_rows(x, two_term)
    for name in ("q", "scales", "sums"):
        assert torch.equal(getattr(want, name), getattr(got, name)), name
    assert (want.residual is None) == (got.residual is None) == (not two_term)
    assert want.residual is None or got.residual is None or torch.equal(want.residual, got.residual)
    assert_same_bits(portable, vector, random_weights(24, 256, seed=1), want, 24)


@pytest.mark.parametrize("two_term", [True, False])
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_random_products_are_the_portable_bits(
    portable: NativeKernels, vector: NativeKernels, n: int, k: int, two_term: bool
) -> None:
    weights = random_weights(n, k, seed=n + k)
    for num_rows in ROW_COUNTS:
        x = torch.randn(num_rows, k, generator=torch.Generator().manual_seed(num_rows)) * 3
        assert_same_bits(portable, vector, weights, portable.quantize_rows(x, two_term), n)


def extreme_rows(num_rows: int, k: int, sign: int, two_term: bool) -> QuantizedRows:
    """Activations at the ends of their range, both terms: q = +-127 (alternating by row), residual likewise."""
    signs = torch.tensor([sign if t % 2 == 0 else -sign for t in range(num_rows)], dtype=torch.int8)[:, None]
    q = (127 * signs).expand(num_rows, k).contiguous()
    residual = q.clone() if two_term else None
    block_sum = 32 * 127 * signs.to(torch.int32).expand(num_rows, k // 32)
    sums = (block_sum * 254 + block_sum if two_term else block_sum).contiguous()
    scales = torch.full((num_rows, k // 32), 0.37)
    return QuantizedRows(q, residual, scales, sums)


def extreme_weights(n: int, k: int) -> list[tuple[int, Int4Weight | Int8Weight]]:
    """All-15 and all-0 nibbles, all -128 and all 127 bytes, and zero blocks (scale 0) between them."""
    scales = torch.full((n, k // 32), 0.5)
    scales[:, 1::3] = 0.0
    all15, all0 = torch.full((n, k), 15, dtype=torch.uint8), torch.zeros(n, k, dtype=torch.uint8)
    lowest, highest = torch.full((n, k), -128, dtype=torch.int8), torch.full((n, k), 127, dtype=torch.int8)
    mixed = torch.where(torch.arange(k) % 2 == 0, -128, 127).to(torch.int8).expand(n, k).contiguous()
    return [
        (4, Int4Weight(all15, scales, -8 * scales)),
        (4, Int4Weight(all0, scales, scales)),
        (8, Int8Weight(lowest, scales, 32)),
        (8, Int8Weight(highest, scales, 32)),
        (8, Int8Weight(mixed, scales, 32)),
    ]


@pytest.mark.parametrize("two_term", [True, False])
@pytest.mark.parametrize(("n", "k"), [(16, 32), (7, 96), (33, 128)])
def test_edge_values_are_the_portable_bits(
    portable: NativeKernels, vector: NativeKernels, n: int, k: int, two_term: bool
) -> None:
    for sign in (1, -1):
        for num_rows in (1, 5, 16):
            assert_same_bits(portable, vector, extreme_weights(n, k), extreme_rows(num_rows, k, sign, two_term), n)


@pytest.mark.parametrize("two_term", [True, False])
def test_a_row_alone_is_the_row_in_a_batch_and_on_two_threads(vector: NativeKernels, two_term: bool) -> None:
    n, k = 200, 576
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(3))
    for bits, weight in random_weights(n, k, seed=5):
        packed = pack_int4(weight) if bits == 4 else pack_int8(weight)
        batch = vector.matmul(packed, bits, vector.quantize_rows(x, two_term), n)
        assert torch.equal(batch, vector.matmul(packed, bits, vector.quantize_rows(x, two_term), n, threads=2))
        for row in (0, 7, 15):
            alone = vector.matmul(packed, bits, vector.quantize_rows(x[row : row + 1].contiguous(), two_term), n)
            assert torch.equal(alone[0], batch[row]), (vector.isa, bits, row)


def test_a_library_built_with_clang_computes_the_same_bits(portable: NativeKernels, clang: str, tmp_path: Path) -> None:
    library = built_library(clang, tmp_path)
    n, k = 40, 160
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(9)) * 3
    for isa in portable.runnable_paths():
        built_by_clang = NativeKernels(library, isa)
        for two_term in (True, False):
            want, got = portable.quantize_rows(x, two_term), built_by_clang.quantize_rows(x, two_term)
            assert torch.equal(want.q, got.q) and torch.equal(want.sums, got.sums), isa
            assert_same_bits(portable, built_by_clang, random_weights(n, k, seed=2), want, n)
