"""Constrained answers from a real (tiny, random) model validate: a set of JSON schemas checked
with jsonschema, regexes with `re`, choices by membership. The random model writes nothing
sensible of its own accord, so every valid answer is the mask's doing."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from shared.sampling import SamplingParams
from shared.structured_output import StructuredOutput, choice_output, json_schema_output, tool_call_output
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.support.tiny_models import make_tiny_model
from worker.engine.generate import generate
from worker.serving_model import ServingModel, load_serving_model

NAME = {"type": "string", "minLength": 1, "maxLength": 6}
SCHEMAS = {
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "name": NAME,
                    "address": {"type": "object", "properties": {"city": NAME}, "additionalProperties": False},
                },
                "required": ["name", "address"],
                "additionalProperties": False,
            }
        },
        "required": ["user"],
        "additionalProperties": False,
    },
    "arrays with min and max items": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}},
        "required": ["tags"],
        "additionalProperties": False,
    },
    "enums and bounded numbers": {
        "type": "object",
        "properties": {
            "size": {"enum": ["S", "M", "L"]},
            "count": {"type": "integer", "minimum": 3, "maximum": 9},
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
        },
        "required": ["size", "count", "ratio"],
        "additionalProperties": False,
    },
    "anyOf": {
        "type": "object",
        "properties": {"value": {"anyOf": [{"type": "boolean"}, {"type": "null"}, {"enum": [1, 2]}]}},
        "required": ["value"],
        "additionalProperties": False,
    },
    "a top-level array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 5}, "maxItems": 4},
}
REGEXES = [r"[A-Z]{2}-[0-9]{3}", r"(yes|no), (because|since) [a-z]{1,5}\."]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module", params=["qwen3", "qwen3_next"])
def served(request, tmp_path_factory: pytest.TempPathFactory) -> ServingModel:
    """A plain tiny model, and a hybrid (gated DeltaNet + gated attention): the mask serves both."""
    folder = tmp_path_factory.mktemp("structured") / "tiny"
    if request.param == "qwen3":
        return load_serving_model(make_tiny_model(folder), "none")
    return load_serving_model(make_tiny_hybrid_model(folder, request.param), "none")


def answer(served: ServingModel, output: StructuredOutput, seed: int) -> tuple[str, str]:
    params = SamplingParams(max_tokens=400, temperature=1.0, seed=seed, structured=output)
    with one_torch_thread():
        result = generate(served.runner, served.tokenizer, served.encode_text("Answer:"), params)
    return result.text, result.finish_reason


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_answers_validate_against_their_schema(served: ServingModel, name: str) -> None:
    schema = SCHEMAS[name]
    for seed in SEEDS:
        text, finish_reason = answer(served, json_schema_output(schema, "response_format"), seed)
        assert finish_reason == "stop", (seed, text)
        jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("pattern", REGEXES)
def test_answers_match_their_regex(served: ServingModel, pattern: str) -> None:
    for seed in SEEDS:
        text, finish_reason = answer(served, StructuredOutput("regex", pattern, "guided_regex"), seed)
        assert finish_reason == "stop" and re.fullmatch(pattern, text), (seed, text)


def test_answers_are_one_of_their_choices(served: ServingModel) -> None:
    choices = ["north", "south", "east by north-east"]
    texts = {answer(served, choice_output(choices, "guided_choice"), seed)[0] for seed in range(6)}
    assert texts <= set(choices) and len(texts) > 1, texts


def test_without_the_mask_the_model_writes_no_json(served: ServingModel) -> None:
    """The control: the same model, unconstrained, is not JSON (so the tests above can fail)."""
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=0, ignore_eos=True)
    with one_torch_thread():
        text = generate(served.runner, served.tokenizer, served.encode_text("Answer:"), params).text
    with pytest.raises(ValueError):
        json.loads(text)


def test_forced_tool_calls_carry_arguments_valid_for_their_function(served: ServingModel) -> None:
    """tool_choice "required": the <tool_call> block names a function and its arguments validate
    against that function's parameters (one call: parallel calls from a random model run on)."""
    weather = {
        "type": "object",
        "properties": {"city": NAME, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    nothing = {"type": "object", "properties": {}, "additionalProperties": False}
    functions = [{"name": "get_weather", "parameters": weather}, {"name": "noop", "parameters": nothing}]
    for seed in SEEDS:
        text, finish_reason = answer(served, tool_call_output(functions, False, "tool_choice"), seed)
        assert finish_reason == "stop", (seed, text)
        blocks = re.findall(r"<tool_call>\n(.*?)\n</tool_call>", text, flags=re.DOTALL)
        assert len(blocks) == 1 and f"<tool_call>\n{blocks[0]}\n</tool_call>" == text, text
        call = json.loads(blocks[0])
        if call["name"] == "get_weather":
            jsonschema.validate(call["arguments"], weather)
        else:
            assert call["name"] == "noop" and call["arguments"] == {}, call
