"""Validating a request body: one way for every route, unknown fields included.

A field the route's model does not know is ignored (agent CLIs add fields with every release:
`thinking.display`, `client_metadata`, a replayed block's `caller: null`), logged once per route
and field in this process, and counted in `arbor_ignored_request_fields_total{route,field}`.
With `ARBOR_STRICT_REQUEST_FIELDS=true` it is a 400 naming it instead (`shared.request_fields`).

Field names come from clients, so the labels are bounded: a client sending a new made-up name
with every request must not grow the registry without end. Past `MAX_FIELD_LABELS` distinct
(route, field) pairs, new ones are counted as `field="(other)"`; a name is cut to
`MAX_FIELD_CHARS`, and a character that is not printable (a control character, a line or
paragraph separator) is written as `?`, so that every sample stays one line for any reader.
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from prometheus_client import Counter
from pydantic import BaseModel

from shared.request_fields import UnknownField, take_unknown, unknown_fields_error

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)

MAX_FIELD_LABELS = 256
MAX_FIELD_CHARS = 120
OTHER_FIELDS = "(other)"


class BodyParser:
    """Validates bodies for every route of one app; remembers which fields it has logged."""

    def __init__(self, strict: bool, ignored: Counter) -> None:
        self._strict = strict
        self._ignored = ignored  # labels: route, field
        self._logged: set[tuple[str, str]] = set()

    def parse(self, model: type[Body], raw: bytes, route: str, context: dict[str, Any] | None = None) -> Body:
        """`raw` validated as `model`, without its unknown fields (raises pydantic.ValidationError)."""
        body = model.model_validate_json(raw, context=context)
        unknown = take_unknown(body)
        refused = [field for field in unknown if field.refused_when_strict]
        if self._strict and refused:
            raise unknown_fields_error(model.__name__, refused)
        counted: set[str] = set()  # each label once per request
        for field in unknown:
            label = self._label(route, field)
            if label not in counted:
                counted.add(label)
                self._count(route, label, field)
        return body

    def _count(self, route: str, label: str, field: UnknownField) -> None:
        self._ignored.labels(route=route, field=label).inc()
        if (route, label) not in self._logged:
            self._logged.add((route, label))
            log.info("%s: ignoring unknown field %s (first seen as %s)", route, label, field.path[:200])

    def _label(self, route: str, field: UnknownField) -> str:
        label = "".join(char if char.isprintable() else "?" for char in field.label[:MAX_FIELD_CHARS])
        if (route, label) in self._logged or len(self._logged) < MAX_FIELD_LABELS:
            return label
        return OTHER_FIELDS
