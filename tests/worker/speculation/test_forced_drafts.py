"""Grammar-forced drafts: what a structured output's grammar forces is drafted, in every mode.

The drafts are llguidance's own forced bytes, tokenized, for the committed output (the oracle:
a matcher stepped token by token); the output is the plain path's, greedy and seeded, token for
token; sampled answers keep their distribution (a chi-square test); and a JSON answer takes
fewer target forwards than tokens.
"""

from __future__ import annotations

import json
import math
from collections import Counter

import llguidance
import pytest

from shared.sampling import SamplingParams
from shared.structured_output import json_schema_output
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_models import make_tiny_model, train_tokenizer
from worker.engine.generate import generate
from worker.engine.grammar_constraint import GrammarConstraint, GrammarMasks
from worker.serving_model import ServingModel, load_serving_model

TOKENIZER = train_tokenizer()
EOS = TOKENIZER.token_to_id("<|im_end|>")
RECORD = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "size": {"enum": ["S", "M", "L", "XL"]},
        "count": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "size", "count"],
    "additionalProperties": False,
}
DOCUMENT = '{"name":"fox","size":"XL","count":42}'


def oracle_forced(output, tokens: list[int]) -> list[int]:
    tokenizer = llguidance.LLTokenizer(TOKENIZER.to_str(), n_vocab=TOKENIZER.get_vocab_size(), eos_token=EOS)
    matcher = llguidance.LLMatcher(tokenizer, output.check(), log_level=0)
    for token in tokens:
        assert matcher.consume_token(token), matcher.get_error()
    if matcher.is_stopped():
        return [EOS]
    return list(tokenizer.tokenize_bytes(matcher.compute_ff_bytes()))


def test_the_drafts_are_the_forced_bytes_of_the_committed_output_and_leave_it_untouched():
    output = json_schema_output(RECORD, "response_format")
    masks = GrammarMasks(TOKENIZER.to_str(), TOKENIZER.get_vocab_size(), eos_ids=[EOS], device="cpu")
    lane = GrammarConstraint(masks, masks.compile(output.check()), {EOS})
    tokens = TOKENIZER.encode(DOCUMENT, add_special_tokens=False).ids
    forced_anywhere = 0
    for step in range(len(tokens) + 1):
        expected = oracle_forced(output, tokens[:step])
        assert lane.forced_tokens(tokens[:step], 32) == expected, step
        assert lane.forced_tokens(tokens[:step], 2) == expected[:2], "cut at the limit"
        forced_anywhere += len(expected)
    assert forced_anywhere >= 8, "keys, separators and the end are forced"
    assert lane.forced_tokens(tokens, 32) == [EOS]


@pytest.fixture(scope="module", params=["none", "ngram"])
def served(request, tmp_path_factory) -> ServingModel:
    return load_serving_model(make_tiny_model(tmp_path_factory.mktemp("forced") / "tiny"), request.param)


def run(served: ServingModel, params: SamplingParams, forced: bool):
    served.runner.forced_drafts = forced
    try:
        with one_torch_thread():
            return generate(served.runner, served.tokenizer, served.encode_text("Record:"), params)
    finally:
        served.runner.forced_drafts = True


def test_greedy_answers_are_the_plain_paths_in_fewer_forwards(served: ServingModel):
    params = SamplingParams(max_tokens=60, structured=json_schema_output(RECORD, "response_format"))
    plain, drafted = run(served, params, forced=False), run(served, params, forced=True)
    assert drafted.token_ids == plain.token_ids
    json.loads(drafted.text)
    assert drafted.stats.target_forwards < plain.stats.target_forwards
    assert drafted.stats.tokens_per_forward > 1.3


def test_seeded_samples_are_the_plain_paths_token_for_token(served: ServingModel):
    output = json_schema_output(RECORD, "response_format")
    for seed in range(4):
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=seed, structured=output)
        assert run(served, params, forced=True).token_ids == run(served, params, forced=False).token_ids, seed


def test_sampled_choices_keep_their_distribution(served: ServingModel):
    """The enum value an answer picks, sampled with and without forced drafts (different seeds):
    a chi-square test of homogeneity over the four values accepts them as one distribution."""
    if served.runner.drafter is not None:
        pytest.skip("one mode is enough for the distribution")
    output = json_schema_output(RECORD, "response_format")

    def sizes(forced: bool, seeds: range) -> Counter[str]:
        return Counter(
            json.loads(
                run(served, SamplingParams(max_tokens=60, temperature=1.0, seed=s, structured=output), forced).text
            )["size"]
            for s in seeds
        )

    drafted, plain = sizes(True, range(0, 300)), sizes(False, range(1000, 1300))
    values = sorted(set(drafted) | set(plain))
    statistic = 0.0
    for value in values:
        total = drafted[value] + plain[value]
        for counts in (drafted, plain):
            expected = total / 2
            statistic += (counts[value] - expected) ** 2 / expected
    dof = len(values) - 1
    # p < 0.001 critical values of chi-square for 1..3 degrees of freedom
    assert dof >= 1 and statistic < {1: 10.83, 2: 13.82, 3: 16.27}[dof], (drafted, plain)
    assert math.isfinite(statistic)
