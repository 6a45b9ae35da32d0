"""The format rule: which format `--dtype`, `--quantize`, the file, the device and the kernels give
(torch-free). One format per linear, whatever the rows: no timing enters the rule, so a forward
of one row and one of a hundred multiply by the same weights in the same kernels."""

from __future__ import annotations

import pytest

from worker.models.weight_formats import LinearFormats, drafter_formats, linear_formats

NATIVE = "avx512_vnni"


def test_explicit_float32_is_the_exact_path_even_for_a_quantized_file() -> None:
    for source in ("int4", "int8", None):
        formats = linear_formats("auto", "float32", "cpu", source, NATIVE)
        assert formats == LinearFormats("float32", "float32", "float32") and formats.is_exact_path
    assert linear_formats("auto", "float64", "cpu", "int4").formats == ("float64",)


@pytest.mark.parametrize(("source", "expected"), [("int4", "int4"), ("int8", "int8")])  # Q4_0/Q4_1, Q8_0
@pytest.mark.parametrize("native_isa", [NATIVE, "portable", None])  # None: torch's kernels (the fallback)
def test_auto_keeps_a_quantized_gguf_in_its_own_format_alone(source: str, expected: str, native_isa: str) -> None:
    formats = linear_formats("auto", "auto", "cpu", source, native_isa)
    assert formats.formats == (expected,), "one format held: nothing for a row count to switch to"
    assert (formats.body, formats.head, formats.activation_dtype, formats.refine_head) == (
        expected,
        expected,
        "float32",
        True,
    )
    assert formats.kernels == ("torch" if native_isa is None else "native")
    assert formats.native_isa == native_isa


def test_the_default_model_on_the_torch_fallback_is_int4_and_only_int4() -> None:
    formats = linear_formats("auto", "auto", "cpu", "int4", None)
    assert formats == LinearFormats("float32", "int4", "int4", refine_head=True)
    assert formats.describe() == "int4 (torch)"
    assert linear_formats("auto", "auto", "cpu", "int4", NATIVE).describe() == "int4 (native avx512_vnni)"


def test_auto_on_cuda_runs_bfloat16_activations_on_torch_kernels() -> None:
    formats = linear_formats("auto", "auto", "cuda", "int4", NATIVE)
    assert formats.activation_dtype == "bfloat16" and formats.kernels == "torch" and formats.formats == ("int4",)
    assert linear_formats("auto", "auto", "cuda", None) == LinearFormats("bfloat16", "bfloat16", "bfloat16")


def test_a_float_checkpoint_stays_dense_unless_asked_to_quantize() -> None:
    assert linear_formats("auto", "auto", "cpu", None).is_exact_path
    assert linear_formats("int8", "auto", "cpu", None) == LinearFormats("float32", "int8", "int8", refine_head=True)
    bfloat16 = linear_formats("int4", "bfloat16", "cpu", None)
    assert bfloat16.formats == ("int4",) and not bfloat16.refine_head  # its logits are bfloat16 anyway


def test_none_with_bfloat16_is_dense_bfloat16() -> None:
    assert linear_formats("none", "bfloat16", "cpu", "int4") == LinearFormats("bfloat16", "bfloat16", "bfloat16")


def test_unknown_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="quantize='int3'"):
        linear_formats("int3", "auto", "cpu", None)


@pytest.mark.parametrize("quantize", ["int4", "int8"])
def test_a_drafter_beside_a_quantized_target_is_int8_on_the_targets_kernels(quantize: str) -> None:
    target = linear_formats(quantize, "auto", "cpu", None, native_isa="avx2")
    drafter = drafter_formats(target)
    assert drafter.body == "int8" and target.body == quantize
    assert (drafter.kernels, drafter.native_isa, drafter.native_activations) == ("native", "avx2", "int16")


def test_a_drafter_beside_a_dense_target_stays_dense() -> None:
    target = linear_formats("auto", "float32", "cpu", "int4")
    assert drafter_formats(target) == target
