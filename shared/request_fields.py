"""Fields a request body carries that its model does not know: accepted and ignored, as vLLM and
llama.cpp do, then listed by path so the gateway can log and count them (or refuse them, under
`ARBOR_STRICT_REQUEST_FIELDS`).

Every public request model derives from `Lenient` (pydantic's `extra="allow"`: the unknown keys
are kept aside in `__pydantic_extra__`). `take_unknown` walks a validated body once, collects
each model's unknown keys with their place in the body, and removes them, so a job's body never
carries them to a worker. Known fields keep their strict types and ranges.

    {"model": "m", "messages": [{"role": "user", "content": "hi", "mood": 1}], "foo": null}
    -> UnknownField(loc=("foo",)), UnknownField(loc=("messages", 0, "mood"))
    -> labels "foo" and "messages.*.mood" (indices folded, so one label per field, not per turn)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

Loc = tuple[str | int, ...]


class Lenient(BaseModel):
    """A request model that ignores what it does not know (see the module docstring)."""

    model_config = ConfigDict(extra="allow", strict=True)

    # False where unknown keys were always ignored, even before this policy: replayed output
    # items (ids, statuses, annotations) and Anthropic's top level. The strict setting keeps them.
    refused_when_strict: ClassVar[bool] = True


@dataclass(frozen=True, slots=True)
class UnknownField:
    loc: Loc
    value: Any
    refused_when_strict: bool

    @property
    def path(self) -> str:
        """`messages.0.content.1.caller`: where it was, as a 400 names it."""
        return ".".join(str(part) for part in self.loc)

    @property
    def label(self) -> str:
        """`messages.*.content.*.caller`: the field whatever the turn, for logs and metrics."""
        return ".".join("*" if isinstance(part, int) else part for part in self.loc)


def take_unknown(body: BaseModel) -> list[UnknownField]:
    """The unknown fields anywhere in `body` (each model's own before its fields'), removed from it."""
    found: list[UnknownField] = []
    _walk(body, (), found)
    return found


def _walk(value: Any, loc: Loc, found: list[UnknownField]) -> None:
    if isinstance(value, BaseModel):
        _walk_model(value, loc, found)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _walk(item, (*loc, index), found)


def _walk_model(model: BaseModel, loc: Loc, found: list[UnknownField]) -> None:
    extra = model.__pydantic_extra__
    if extra:
        refused = isinstance(model, Lenient) and model.refused_when_strict
        found.extend(UnknownField((*loc, key), value, refused) for key, value in extra.items())
        extra.clear()
    for name, field in type(model).model_fields.items():
        _walk(getattr(model, name), (*loc, field.alias or name), found)


def unknown_fields_error(title: str, unknown: list[UnknownField]) -> ValidationError:
    """The 400 strict validation gave before this policy: `extra_forbidden` at each field."""
    errors: list[Any] = [{"type": "extra_forbidden", "loc": field.loc, "input": field.value} for field in unknown]
    return ValidationError.from_exception_data(title, errors)
