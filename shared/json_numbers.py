"""Numbers in JSON grammars are bounded: a schema's integers and numbers get the bounds they lack.

A JSON number has no length of its own, so a small model can write `"population": 1111222...`
until `max_tokens`. llguidance has no option to limit a number's digits, and its schema keywords
are the only way into its number lexemes, so the schema is rewritten, here and nowhere else,
before it is compiled (response_format json_schema, guided_json, json_object mode, forced calls'
arguments). What llguidance makes of the added keywords:

    integer   minimum/maximum ±(2**63 - 1024)  -> an int64 range: at most 19 digits, optional "-"
    number    exclusive bounds ±1e17           -> at most 17 digits before the point
              multipleOf 1e-10                 -> at most 10 after it (a finer step is not a float64 it reads exactly)

±(2**63 - 1024) is the int64 range as far as float64 can say it: llguidance reads bounds as
float64, and cannot build the range of the full ±2**63. A bounded number is a plain decimal: the
regexes llguidance builds for a range have no exponent, so a bounded number has none either.
A keyword the schema already has (one bound, a multipleOf) is kept, so only what is missing is
added; a schema with `enum` or `const` is finite already and is left alone. The flexible form
(ARBOR_JSON_NUMBERS=flexible) leaves schemas as they are.

Worked example: {"type": "integer"} -> {"type": "integer", "minimum": -9223372036854774784,
"maximum": 9223372036854774784}; {"type": "number", "minimum": 0} -> {"type": "number",
"minimum": 0, "exclusiveMaximum": 1e17, "multipleOf": 1e-10}.
"""

from __future__ import annotations

from typing import Any, Literal

JsonNumbers = Literal["bounded", "flexible"]
MAX_INT64 = 2**63 - 1024  # the largest float64 below 2**63: llguidance reads bounds as float64
MAX_NUMBER = 1e17  # exclusive: 17 digits before the point
NUMBER_STEP = 1e-10  # 10 digits after it; llguidance refuses 1e-11 as inexact
# Values that are data, not schemas: a const {"type": "integer"} stays as it is.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# A generic JSON value whose numbers are bounded: json_object mode's property values.
ANY_VALUE: dict[str, Any] = {
    "anyOf": [
        {"type": ["null", "boolean", "string", "number"]},
        {"type": "array", "items": {"$ref": "#/$defs/value"}},
        {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}},
    ]
}


def bounded_numbers(schema: Any) -> Any:
    """`schema` (parsed JSON) with bounds added to every integer and number schema in it."""
    if isinstance(schema, list):
        return [bounded_numbers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    bounded = {key: value if key in _DATA_KEYWORDS else bounded_numbers(value) for key, value in schema.items()}
    kinds = _types(schema.get("type"))
    if "enum" in schema or "const" in schema:
        return bounded  # finite already: a bound could only make a listed value unsatisfiable
    if "integer" in kinds and "number" not in kinds:
        return _with_missing_bounds(bounded, -MAX_INT64, MAX_INT64, "minimum", "maximum")
    if "number" in kinds:
        bounded = _with_missing_bounds(bounded, -MAX_NUMBER, MAX_NUMBER, "exclusiveMinimum", "exclusiveMaximum")
        return bounded if "multipleOf" in bounded else bounded | {"multipleOf": NUMBER_STEP}
    return bounded


def bounded_json_object() -> dict[str, Any]:
    """json_object mode's schema: any object, its values' numbers bounded."""
    value = bounded_numbers(ANY_VALUE)
    return {"type": "object", "additionalProperties": {"$ref": "#/$defs/value"}, "$defs": {"value": value}}


def _types(declared: Any) -> set[str]:
    """A schema's "type" as a set: one name or a list of them (anything else names none)."""
    if isinstance(declared, str):
        return {declared}
    return {kind for kind in declared if isinstance(kind, str)} if isinstance(declared, list) else set()


def _with_missing_bounds(
    schema: dict[str, Any], low: float, high: float, low_key: str, high_key: str
) -> dict[str, Any]:
    """Adds the lower and upper bound where missing, unless the schema's own other bound lies
    beyond it (a minimum of 1e20 keeps an integer unbounded above rather than unsatisfiable)."""
    lows, highs = _bounds(schema, "minimum", "exclusiveMinimum"), _bounds(schema, "maximum", "exclusiveMaximum")
    if not lows and all(bound > low for bound in highs):
        schema = schema | {low_key: low}
    if not highs and all(bound < high for bound in lows):
        schema = schema | {high_key: high}
    return schema


def _bounds(schema: dict[str, Any], *keys: str) -> list[float]:
    return [value for key in keys if isinstance(value := schema.get(key), int | float) and not isinstance(value, bool)]
