"""Property-based fuzzing of the live gateway from its own /openapi.json: no input yields a 5xx.

Generated bodies may ask for thousands of tokens; they are capped before sending so the run stays
short (the cap does not change which validation paths a body exercises). Schemathesis' pytest
plugin does not run under pytest 9, so the test drives its Hypothesis strategies directly.
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

from tests.support.fuzz import fuzz_examples

MAX_FUZZ_TOKENS = 8
EXAMPLES_PER_OPERATION = fuzz_examples(30)


def test_no_input_causes_a_server_error(stack):
    schema = schemathesis.openapi.from_url(f"{stack.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert any("chat/completions" in op.path for op in operations), [op.path for op in operations]
    for operation in operations:
        _fuzz(operation)


def _fuzz(operation) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def run(case) -> None:
        _cap_generation(case.body)
        response = case.call(timeout=60)
        case.validate_response(response, checks=(not_a_server_error,))

    run()


def _cap_generation(body: object) -> None:
    if not isinstance(body, dict):
        return
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(field), int) and body[field] > MAX_FUZZ_TOKENS:
            body[field] = MAX_FUZZ_TOKENS
    if isinstance(body.get("n"), int) and body["n"] > 2:
        body["n"] = 2
