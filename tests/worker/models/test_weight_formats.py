"""Which formats `--dtype` and `--quantize` give, per device and file (torch-free)."""

from __future__ import annotations

import pytest

from worker.models.weight_formats import MAX_ALTERNATIVE_PARAMS, LinearFormats, linear_formats

SMALL = 135_000_000


def test_explicit_float32_is_the_exact_path_even_for_a_quantized_file() -> None:
    formats = linear_formats("auto", "float32", "cpu", "int4", SMALL)
    assert formats == LinearFormats("float32", "float32", "float32") and formats.is_exact_path


def test_auto_on_cpu_keeps_a_q4_file_in_int4_with_a_bfloat16_twin() -> None:
    formats = linear_formats("auto", "auto", "cpu", "int4", SMALL)
    assert formats == LinearFormats("float32", "int4", "int4", "bfloat16", refine_head=True)
    assert formats.formats == ("int4", "bfloat16") and not formats.is_exact_path


def test_auto_on_cuda_runs_bfloat16_activations() -> None:
    assert linear_formats("auto", "auto", "cuda", "int4", SMALL).activation_dtype == "bfloat16"
    assert linear_formats("auto", "auto", "cuda", None, SMALL) == LinearFormats("bfloat16", "bfloat16", "bfloat16")


def test_a_float_checkpoint_stays_dense_unless_asked_to_quantize() -> None:
    assert linear_formats("auto", "auto", "cpu", None, SMALL).is_exact_path
    assert linear_formats("int8", "auto", "cpu", None, SMALL) == LinearFormats(
        "float32", "int8", "int8", "bfloat16", refine_head=True
    )
    bfloat16 = linear_formats("int4", "bfloat16", "cpu", None, SMALL)
    assert bfloat16.activation_dtype == "bfloat16" and not bfloat16.refine_head  # its logits are bfloat16 anyway


def test_a_large_model_keeps_one_format() -> None:
    assert linear_formats("int4", "auto", "cpu", None, MAX_ALTERNATIVE_PARAMS + 1).alternative is None


def test_none_with_bfloat16_is_dense_bfloat16() -> None:
    assert linear_formats("none", "bfloat16", "cpu", "int4", SMALL) == LinearFormats("bfloat16", "bfloat16", "bfloat16")


def test_unknown_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="quantize='int3'"):
        linear_formats("int3", "auto", "cpu", None, SMALL)
