"""The bytes a loaded model's tensors really take: what the capacity log reports as its weights.

Not arithmetic over the config (capacity.py does that, before a model is loaded) but a walk over
what the decoder holds: parameters and buffers, and the tensors its layers keep outside them (a
packed int4 kernel's buffers, a quantized head's unpacked source, a refined head's exact weight).
Each storage counts once, whole: a tied head that shares the embedding's storage adds nothing,
a view of a larger tensor counts the larger one. The walk follows modules, containers and plain
objects' attributes; it stops at functions, classes and Python modules (a bound method's globals
would reach the whole process).
"""

from __future__ import annotations

import types

import torch

_OPAQUE = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.ModuleType,
    type,
    str,
    bytes,
    int,
    float,
    torch.dtype,
    torch.device,
)


def held_tensor_bytes(*roots: object) -> int:
    """Bytes of every distinct tensor storage reachable from `roots`."""
    storages: dict[tuple[str, int], int] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, _OPAQUE) or item is None:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            storages[(str(item.device), storage.data_ptr())] = storage.nbytes()
        else:
            stack.extend(_referents(item))
    return sum(storages.values())


def _referents(item: object) -> list[object]:
    if isinstance(item, dict):
        return list(item.values())
    if isinstance(item, list | tuple | set | frozenset):
        return list(item)
    attributes = list(vars(item).values()) if hasattr(item, "__dict__") else []
    for cls in type(item).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            attributes.append(getattr(item, slot, None))
    return attributes
