"""A decoder's layers in one native call per forward (native/fused_layers.c), on every native ISA.

Why: at one row a SmolLM2 layer is ~25 small PyTorch ops around four products, ~10 us each on a
CPU, so eager dispatch cost as much as the int4 products themselves. One call per forward runs
norms, q/k/v, RoPE, the K/V writes, attention over each row's visible keys, o, the MLP and the
residuals for every layer, with no Python between them.

What a forward must be to take this path (`FusedLayers.runs`): float32 activations, every layer's
products on the native kernels in the format serving this forward, and all lanes' K/V in one
storage (the worker's block pool, or a single lane's own cache). Anything else takes the
PyTorch path, which computes the same model (tests compare the two).

The native layers run on whichever vector ISA the kernels do (AVX-512, AVX2, AVX-VNNI, NEON) and
give the portable C path's bits on each. `fusable` leaves the portable path out (a forward there
is ~50x slower than torch's); tests force it through `FusedLayers(isa="portable")` as the reference.

Per forward the Python side builds each row's key list description once (`RowTables`), shared
by all layers: the lanes' slot tables, each row's committed context and index among its lane's
new rows, and tree masks.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker.kernels.cpu_features import ISA_CODES
from worker.kernels.native_lib import NativeKernels, UnsupportedPathError
from worker.kernels.native_linear import NativeQuantizedLinear

_P = ctypes.c_void_p
# Rows a forward needs before its phases are split over threads: a few-row step's phases last a few
# microseconds, and on a shared 2-vCPU machine a partner thread that lost its core made the spin
# barriers cost more than the split saved (one stream through the stack: 66 tokens/s on 2 threads
# against 82 on 1, with other jobs running). The numbers do not depend on the count either way.
MIN_ROWS_TO_SPLIT = 8


class _Layer(ctypes.Structure):
    _fields_ = [
        ("attn_norm", _P),
        ("ffn_norm", _P),
        ("q_norm", _P),
        ("k_norm", _P),
        ("qkv_bias", _P),
        ("qkv", _P),
        ("o", _P),
        ("gate_up", _P),
        ("down", _P),
        ("qkv_bits", ctypes.c_int),
        ("o_bits", ctypes.c_int),
        ("gate_up_bits", ctypes.c_int),
        ("down_bits", ctypes.c_int),
    ]


class _Dims(ctypes.Structure):
    _fields_ = [
        ("hidden", ctypes.c_int),
        ("heads", ctypes.c_int),
        ("kv_heads", ctypes.c_int),
        ("head_dim", ctypes.c_int),
        ("inner", ctypes.c_int),
        ("kv_stride", ctypes.c_long),
        ("eps", ctypes.c_float),
    ]


class _Rows(ctypes.Structure):
    _fields_ = [
        ("key_base", _P),
        ("context", _P),
        ("index", _P),
        ("lane_rows", _P),
        ("mask_offset", _P),
        ("slots", _P),
        ("masks", _P),
    ]


@dataclass(slots=True)
class RowTables:
    """What each row of a forward attends to; tensors kept alive for the call's duration."""

    per_row: torch.Tensor  # [5, rows] int32: key_base, context, index, lane_rows, mask_offset
    slots: torch.Tensor  # [sum of lanes' start + rows] int32
    masks: torch.Tensor  # [sum of tree lanes' rows^2] uint8
    max_keys: int

    @staticmethod
    def build(
        spans: Sequence, lane_slots: Sequence[torch.Tensor], tree_masks: Sequence[torch.Tensor | None]
    ) -> RowTables:
        """`lane_slots[i]`: lane i's slots for tokens [0, start + rows); `tree_masks[i]`: [rows, rows] or None."""
        columns: list[list[int]] = [[], [], [], [], []]
        masks: list[torch.Tensor] = []
        key_base, mask_base, max_keys = 0, 0, 1
        for span, tree in zip(spans, tree_masks, strict=True):
            rows = span.num_rows
            offset = -1
            if tree is not None:
                offset = mask_base
                masks.append(tree.to(torch.uint8).flatten())
                mask_base += rows * rows
            for index in range(rows):
                for column, value in zip(columns, (key_base, span.start, index, rows, offset)):
                    column.append(value)
            key_base += span.start + rows
            max_keys = max(max_keys, span.start + rows)
        per_row = torch.tensor(columns, dtype=torch.int32)
        flat = torch.cat([s.to(torch.int32) for s in lane_slots])
        mask = torch.cat(masks) if masks else torch.zeros(1, dtype=torch.uint8)
        return RowTables(per_row, flat.contiguous(), mask.contiguous(), max_keys)


def fusable(config, kernels: NativeKernels) -> bool:
    """Kernels on a vector ISA, and the shapes the native layers handle: products in blocks of 32,
    vectors of 16 floats."""
    return (
        kernels.isa != "portable"
        and config.hidden_size % 32 == 0
        and config.intermediate_size % 32 == 0
        and config.head_dim % 16 == 0
        and config.head_dim <= 512
        and (config.num_attention_heads * config.head_dim) % 32 == 0
        and config.num_attention_heads % config.num_key_value_heads == 0
        and config.num_attention_heads // config.num_key_value_heads <= max_query_heads_per_kv_head(kernels)
    )


def max_query_heads_per_kv_head(kernels: NativeKernels) -> int:
    """The widest group the native attention takes (a tile holds one row's at least); wider: per op."""
    return int(kernels.lib.arbor_max_query_heads_per_kv_head())


class FusedLayers:
    def __init__(
        self,
        decoder,
        kernels: NativeKernels,
        format_index: int,
        two_term: bool = True,
        threads: int = 1,
        isa: str | None = None,
    ):
        """`isa`: the path to run (ISA_CODES' names), by default the kernels'; the bits are the same on each."""
        config = decoder.config
        self.kernels = kernels
        self.isa = isa or kernels.isa
        if not kernels.supports(self.isa):  # running it would be an illegal instruction, not an error
            raise UnsupportedPathError(f"native layers: this CPU or library does not run the {self.isa} path")
        self.isa_code = ISA_CODES[self.isa]
        self.format_index = format_index  # the PlannedLinear format these products are in
        self.two_term = two_term
        self.threads = threads  # split inside the call; a row's numbers do not depend on it
        self.num_layers = config.num_hidden_layers
        self.dims = _Dims(
            config.hidden_size,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.intermediate_size,
            0,
            config.rms_norm_eps,
        )
        self._keep: list[torch.Tensor] = []
        self.layers = (_Layer * self.num_layers)(*(self._layer(layer) for layer in decoder.model.layers))
        self.fn = kernels.lib.arbor_forward_layers
        ints = [ctypes.c_int] * 4  # max_keys, two_term, threads, isa
        self.fn.argtypes = [_P, ctypes.c_int, _P, _P, ctypes.c_int, _P, _P, _P, _P, _P, _P, *ints]
        self.fn.restype = ctypes.c_int

    def _ptr(self, tensor: torch.Tensor | None) -> int | None:
        if tensor is None:
            return None
        tensor = tensor.detach().to(torch.float32).contiguous()
        self._keep.append(tensor)
        return tensor.data_ptr()

    def _native(self, planned) -> NativeQuantizedLinear:
        module = planned.modules_by_format[self.format_index]
        assert isinstance(module, NativeQuantizedLinear), type(module)
        return module

    def _layer(self, layer) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        qkv, o = self._native(attn.qkv_proj), self._native(attn.o_proj)
        gate_up, down = self._native(mlp.gate_up_proj), self._native(mlp.down_proj)
        return _Layer(
            self._ptr(layer.input_layernorm.weight),
            self._ptr(layer.post_attention_layernorm.weight),
            self._ptr(attn.q_norm.weight if attn.q_norm is not None else None),
            self._ptr(attn.k_norm.weight if attn.k_norm is not None else None),
            self._ptr(qkv.bias),
            qkv.packed.data_ptr(),
            o.packed.data_ptr(),
            gate_up.packed.data_ptr(),
            down.packed.data_ptr(),
            qkv.bits,
            o.bits,
            gate_up.bits,
            down.bits,
        )

    def forward(
        self,
        x: torch.Tensor,  # [rows, hidden] float32, updated in place
        cos: torch.Tensor,  # [rows, head_dim]
        sin: torch.Tensor,
        tables: RowTables,
        keys: torch.Tensor,  # [layers, kv_heads, slots, head_dim] float32
        values: torch.Tensor,
        hidden_out: dict[int, torch.Tensor],
    ) -> None:
        self.dims.kv_stride = keys.shape[2]
        per_row = tables.per_row
        rows = _Rows(*(per_row[i].data_ptr() for i in range(5)), tables.slots.data_ptr(), tables.masks.data_ptr())
        outs = (_P * self.num_layers)(
            *(hidden_out[i].data_ptr() if i in hidden_out else None for i in range(self.num_layers))
        )
        cos, sin = cos.contiguous(), sin.contiguous()
        status = self.fn(
            ctypes.addressof(self.layers),
            self.num_layers,
            ctypes.addressof(self.dims),
            x.data_ptr(),
            x.shape[0],
            cos.data_ptr(),
            sin.data_ptr(),
            ctypes.addressof(rows),
            keys.data_ptr(),
            values.data_ptr(),
            ctypes.addressof(outs),
            tables.max_keys,
            int(self.two_term),
            self.threads if x.shape[0] >= MIN_ROWS_TO_SPLIT else 1,
            self.isa_code,
        )
        if status == -3:
            widest = max_query_heads_per_kv_head(self.kernels)
            raise ValueError(f"native layers: more than {widest} query heads a kv head")
        if status == -2:
            raise ValueError(f"native layers: isa={self.isa!r} is not built for this machine's architecture")
        if status != 0:
            raise MemoryError(f"native layers: scratch for {x.shape[0]} rows could not be allocated")
