"""Which weight format each linear layer gets: a torch-free decision made once, at load.

A weight format is how a linear layer's matrix is held and multiplied:
  float64 / float32 / bfloat16 / float16   dense, multiplied in that dtype
  int8                           weight-only, one scale per output row (`_weight_int8pack_mm`)
  int4                           weight-only, groups of 32 along the input, scale + zero each
                                 (`_weight_int4pack_mm[_for_cpu]`)
The activation dtype (`--dtype`) is separate: it is the residual stream's, the norms', the
attention's and the KV cache's. A linear casts its input to its kernel's dtype and back.

`--quantize` chooses the body's format (q/k/v/o and the MLP) and the head's (lm_head). `none`
is the exact path: dense weights in the activation dtype, nothing fused, nothing cast.

One format per linear, by rule, never by timing: the served format follows from the request
(--quantize, --dtype), the checkpoint's quantization, the device and the kernels' choice, and
every forward of every row count runs in it. Why: a row's numbers must not depend on how many
rows share its step (a prefill chunk of one lane alone vs of four lanes together fills the same
K/V), and a start-up race between near-equal formats made them depend on it, and on the
machine's load at start-up. It also keeps one copy of the weights in memory.

The rule, worked through:
  --dtype float32/float64, --quantize auto      the exact path, whatever the file holds
  --quantize auto, a Q4_0/Q4_1 GGUF              int4 (native kernels where chosen, else torch's)
  --quantize auto, a Q8_0 GGUF                   int8
  --quantize auto, a float checkpoint            the exact path in the activation dtype
  --quantize int4/int8                           that format, quantized at load if need be

A drafter's layers (an MTP head's, a DFlash drafter's) follow the target's rule with one change:
where the target's body is int4 or int8, theirs is int8 (`drafter_formats`). A drafter is a layer
or two that feed their own output back down the draft, so its rounding compounds, and it is small,
so int8 costs little. Measured on the default model (the Zen 4, one thread, `arbor bench decode
--dtype auto`, tokens a forward int4 -> int8): the head's chain of 3 1.32 -> 1.39 and tree of 8
1.63 -> 1.68 (dense float32: 1.40 and 1.67), DFlash's block 1.20 -> 1.25 and tree 1.42 -> 1.45;
drafting a step 0.2-0.6 ms dearer. Drafts only propose, so this moves acceptance, never output.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

WeightFormat = Literal["float64", "float32", "bfloat16", "float16", "int8", "int4"]
Quantize = Literal["auto", "none", "int8", "int4"]
ActivationDtype = Literal["auto", "float32", "float64", "bfloat16", "float16"]
QUANTIZE_CHOICES: tuple[Quantize, ...] = ("auto", "none", "int8", "int4")
DTYPE_CHOICES: tuple[ActivationDtype, ...] = ("auto", "float32", "float64", "bfloat16")
QUANTIZED_FORMATS: frozenset[str] = frozenset({"int8", "int4"})


@dataclass(frozen=True, slots=True)
class LinearFormats:
    activation_dtype: str  # "float32", "float64", "bfloat16", "float16"
    body: WeightFormat  # q/k/v/o projections and the MLP
    head: WeightFormat  # lm_head
    refine_head: bool = False  # the head's best candidates recomputed exactly (refined_head.py)
    kernels: str = "torch"  # who multiplies int4/int8: "torch" (aten) or "native" (worker/kernels/)
    native_isa: str | None = None  # the native kernels' path ("avx512_vnni", "portable")
    native_activations: str = "int16"  # "int16" (two int8 terms) or "int8" (one, llama.cpp's)

    @property
    def is_exact_path(self) -> bool:
        """Dense weights in the activation dtype: the unfused, uncast path of before."""
        dense = self.activation_dtype
        return self.body == dense and self.head == dense

    @property
    def formats(self) -> tuple[WeightFormat, ...]:
        """Every format the linears are held in: the body's, and the head's where it differs."""
        return (self.body,) if self.head == self.body else (self.body, self.head)

    def describe(self) -> str:
        """'int4 (native avx512_vnni)': for logs and the benchmarks' reports."""
        if self.is_exact_path:
            return f"{self.body} (exact path)"
        kernels = f"native {self.native_isa}" if self.kernels == "native" else "torch"
        return f"{' + '.join(self.formats)} ({kernels})"


def resolve_activation_dtype(dtype: str, device_type: str) -> str:
    """`auto`: float32 on CPU (the kernels cast to bfloat16 themselves; the rest stays exact-ish
    and costs little), bfloat16 on CUDA."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device_type == "cuda" else "float32"


def resolve_quantize(quantize: str, dtype: str, source_quantization: str | None) -> str:
    """`auto`: an explicit float dtype asks for the exact path ("none"); otherwise keep what the
    file holds (a Q4 GGUF stays int4, a Q8_0 one int8) and leave float checkpoints dense."""
    if quantize != "auto":
        return quantize
    if dtype != "auto":
        return "none"
    return source_quantization or "none"


def linear_formats(
    quantize: str,
    dtype: str,
    device_type: str,
    source_quantization: str | None,
    native_isa: str | None = None,
    native_activations: str = "int16",
) -> LinearFormats:
    """The formats for a model, by the rule of the module docstring; `source_quantization` is "int4",
    "int8" or None.
    `native_isa` set: quantized linears run on the native kernels (worker/kernels/cpu_features.py)."""
    activation = resolve_activation_dtype(dtype, device_type)
    chosen = resolve_quantize(quantize, dtype, source_quantization)
    if chosen == "none":
        return LinearFormats(activation, _dense(activation), _dense(activation))
    if chosen not in QUANTIZED_FORMATS:
        raise ValueError(f"quantize={quantize!r}: choose from {', '.join(QUANTIZE_CHOICES)}")
    body: WeightFormat = "int4" if chosen == "int4" else "int8"
    kernels = "native" if native_isa is not None and device_type == "cpu" else "torch"
    return LinearFormats(
        activation,
        body,
        body,
        refine_head=activation != "bfloat16",
        kernels=kernels,
        native_isa=native_isa if kernels == "native" else None,
        native_activations=native_activations,
    )


def drafter_formats(formats: LinearFormats) -> LinearFormats:
    """A drafter's formats beside a target in `formats`: the body int8 where the target's is quantized."""
    if formats.body not in QUANTIZED_FORMATS:
        return formats
    return replace(formats, body="int8")


def _dense(activation: str) -> WeightFormat:
    formats: dict[str, WeightFormat] = {"float64": "float64", "float32": "float32", "bfloat16": "bfloat16"}
    if activation not in formats and activation != "float16":
        raise ValueError(f"dtype={activation!r}: choose from {', '.join(DTYPE_CHOICES)}")
    return formats.get(activation, "float16")
