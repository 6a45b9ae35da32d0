"""An MTP head's layer in its target's weight format, fused into one native call where the target's are.

The rule is the target's for a drafter (worker/models/weight_formats.py `drafter_formats`),
applied to the head's linears by the same functions (worker/models/fast_weights.py): where the
target's body is int4 or int8, the head's fc, q/k/v (stacked into one product), o, gate/up (one
product) and down are int8 (why: weight_formats.py), on the same kernels (native or torch's) with
the same activation quantization; on the exact path the head stays dense. Where the target's
layers run as one native call (worker/kernels/fused_layers.py), the head's layer does too: at one
row its ~25 PyTorch ops cost as much as its products.

Why it matters: a draft token costs one head layer and the draft vocabulary's logits; beside a
native target step of a few milliseconds, a dense float32 layer and its dispatch were most of a
draft's price. Drafts only propose (verification decides every token), so the rounding moves
acceptance, never output.

The fused call reads all of a forward's K/V from one storage; the head's caches are one per lane,
so a forward over several lanes makes one call per lane. Tree rows each see their own ancestors'
scratch slots: each row goes to the native layer as a lane of its own whose slot table lists
exactly the slots it sees (head_rows.py), so no mask is needed.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from torch import nn

from worker.drafters.head_rows import HeadRows
from worker.kernels.fused_layers import FusedLayers, RowTables, fusable
from worker.kernels.native_lib import load_kernels
from worker.models.config import ModelConfig
from worker.models.decoder import DecoderLayer, Span
from worker.models.fast_weights import LinearSource, planned_linear, stack_rows
from worker.models.planned_linear import PlannedLinear
from worker.models.weight_formats import QUANTIZED_FORMATS, LinearFormats, drafter_formats

MIN_FEATURES_MULTIPLE = 32  # quantized products run in blocks of 32 inputs


def head_formats(formats: LinearFormats | None) -> LinearFormats | None:
    """The head's formats beside a target in `formats` (None: the target has no planned formats)."""
    return None if formats is None else drafter_formats(formats)


def head_in_target_format(head: nn.Module, formats: LinearFormats | None, device: torch.device | str) -> bool:
    """Put the head's linears in its format beside this target (False: the target is dense, so is the head)."""
    formats = head_formats(formats)
    if formats is None or formats.body not in QUANTIZED_FORMATS:
        return False
    layer = _layer(head)
    if isinstance(layer, DecoderLayer):  # stacked like the target's layers (fast_weights._fuse_*)
        attn, mlp = layer.self_attn, layer.mlp
        attn.qkv_proj = _planned([attn.q_proj, attn.k_proj, attn.v_proj], formats, device)
        attn.o_proj = _planned([attn.o_proj], formats, device)
        del attn.q_proj, attn.k_proj, attn.v_proj
        mlp.gate_up_proj = _planned([mlp.gate_proj, mlp.up_proj], formats, device)
        mlp.down_proj = _planned([mlp.down_proj], formats, device)
        del mlp.gate_proj, mlp.up_proj
    _plan_linears(head, formats, device)  # fc, and a hybrid head's projections one by one
    return True


def fused_head_layer(head: nn.Module, config: ModelConfig, formats: LinearFormats | None) -> FusedLayers | None:
    """The head's layer as one native call, where the target's layers are one (loader._fused_layers' rule)."""
    formats = head_formats(formats)
    layer = _layer(head)
    if (
        formats is None
        or formats.kernels != "native"
        or formats.body not in QUANTIZED_FORMATS
        or formats.activation_dtype != "float32"
        or config.mlp_bias
        or not isinstance(layer, DecoderLayer)
        or layer.self_attn.qkv_proj is None
    ):
        return None
    kernels = load_kernels(formats.native_isa or "portable")
    if not fusable(config, kernels):
        return None
    one_layer = SimpleNamespace(
        config=dataclasses.replace(config, num_hidden_layers=1), model=SimpleNamespace(layers=head.layers)
    )
    two_term = formats.native_activations == "int16"
    return FusedLayers(one_layer, kernels, 0, two_term, torch.get_num_threads())


def run_fused_layer(
    fused: FusedLayers,
    x: torch.Tensor,  # [R, hidden] float32: every lane's rows, lane by lane
    cos: torch.Tensor,  # [R, rotary_dim]
    sin: torch.Tensor,
    lanes: list[HeadRows],
) -> torch.Tensor:
    """The head's layer over the lanes' rows ([R, hidden] out), one native call per lane (their
    caches reserved by the caller, MtpDrafter.run_head)."""
    outs, first = [], 0
    for lane in lanes:
        rows = slice(first, first + lane.num_rows)
        spans, slot_tables = _row_tables(lane)
        tables = RowTables.build(spans, slot_tables, [None] * len(spans))
        lane_x = x[rows].contiguous()
        fused.forward(lane_x, cos[rows], sin[rows], tables, lane.cache.keys, lane.cache.values, {})
        outs.append(lane_x)
        first += lane.num_rows
    return torch.cat(outs) if len(outs) > 1 else outs[0]


def _row_tables(lane: HeadRows) -> tuple[list[Span], list[torch.Tensor]]:
    """A run as one lane over slots [0, start + T); tree rows as one lane each over the slots it sees."""
    if lane.scratch is None:
        span = Span(lane.cache, lane.start, 0, lane.num_rows, None)
        return [span], [torch.arange(lane.start + lane.num_rows, dtype=torch.int32)]
    spans, tables = [], []
    for row in range(lane.num_rows):
        visible = lane.visible_slots(row)  # its own slot last: where the native layer writes its K/V
        spans.append(Span(lane.cache, len(visible) - 1, row, 1, None))
        tables.append(torch.tensor(visible, dtype=torch.int32))
    return spans, tables


def _layer(head: nn.Module) -> nn.Module:
    layers = head.layers
    assert isinstance(layers, nn.ModuleList), type(layers)
    return layers[0]


def _planned(parts: list[nn.Module], formats: LinearFormats, device: torch.device | str) -> nn.Module:
    sources = [LinearSource(_weight(part), _bias(part)) for part in parts]
    return planned_linear(stack_rows(sources), formats.body, formats, device)


def _plan_linears(module: nn.Module, formats: LinearFormats, device: torch.device | str) -> None:
    for name, child in module.named_children():
        if isinstance(child, PlannedLinear):
            continue
        if isinstance(child, nn.Linear) and child.in_features % MIN_FEATURES_MULTIPLE == 0:
            setattr(module, name, _planned([child], formats, device))
        elif not isinstance(child, nn.Linear):
            _plan_linears(child, formats, device)


def _weight(linear: nn.Module) -> torch.Tensor:
    weight = linear.weight
    assert isinstance(weight, torch.Tensor), type(weight)
    return weight.detach().float()


def _bias(linear: nn.Module) -> torch.Tensor | None:
    bias = getattr(linear, "bias", None)
    return None if bias is None else bias.detach().float()
