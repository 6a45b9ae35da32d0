"""Validating a request body: one way for every route, unknown fields included.

A field the route's model does not know is ignored (agent CLIs add fields with every release:
`thinking.display`, `client_metadata`, a replayed block's `caller: null`), logged once per route
and field in this process, and counted in `arbor_ignored_request_fields_total{route,field}`.
With `ARBOR_STRICT_REQUEST_FIELDS=true` it is a 400 naming it instead (`shared.request_fields`).
"""

from __future__ import annotations

import logging
from typing import Any, TypeVar

from prometheus_client import Counter
from pydantic import BaseModel

from shared.request_fields import UnknownField, take_unknown, unknown_fields_error

log = logging.getLogger(__name__)

Body = TypeVar("Body", bound=BaseModel)


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
        for label in dict.fromkeys(field.label for field in unknown):
            self._ignore(route, label, unknown)
        return body

    def _ignore(self, route: str, label: str, unknown: list[UnknownField]) -> None:
        self._ignored.labels(route=route, field=label).inc()
        if (route, label) not in self._logged:
            self._logged.add((route, label))
            example = next(field.path for field in unknown if field.label == label)
            log.info("%s: ignoring unknown field %s (first seen as %s)", route, label, example)
