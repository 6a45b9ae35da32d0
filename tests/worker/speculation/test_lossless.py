"""Losslessness: greedy output under every speculation mode equals plain decoding, token for token.

Tiny random Qwen3 and Llama targets in float64 (so a tree forward and a chain forward cannot
disagree on an argmax through rounding), random drafters in the real formats (MTP inside the
target checkpoint, DFlash as a separate folder), prompts that include self-repeating ones so
that n-gram and suffix drafts get accepted.
"""

from __future__ import annotations

import functools
import json
import random

import pytest

from shared.sampling import SamplingParams
from shared.structured_output import StructuredOutput, choice_output, json_schema_output, tool_call_output
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.grammar_constraint import GrammarMasks
from worker.engine.runner import ModelRunner
from worker.engine.stats import SpecStats
from worker.models.loader import LoadedModel, load_model

MODES = ("none", "mtp", "mtp-tree", "dflash", "tree", "ngram", "suffix", "auto")
FAMILIES = ("qwen3", "llama")
NUM_PROMPTS = 10  # per family, 64 tokens each; the slow variant runs 40
PREFILL_CHUNK = 7  # small, so drafters also see prefills arrive in several chunks
GREEDY = SamplingParams(max_tokens=64, ignore_eos=True)
PENALIZED = SamplingParams(
    max_tokens=32, ignore_eos=True, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2
)
NUM_BANNED = 6  # the tokens plain greedy decoding emits most, banned with logit_bias -100
SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 0, "maximum": 999},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "owner": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"name": {"type": "string"}}}]},
    },
    "required": ["id", "tags", "owner"],
    "additionalProperties": False,
}
CONSTRAINTS = {
    "json": StructuredOutput("json_object", "", "response_format"),
    "schema": json_schema_output(SCHEMA, "response_format.json_schema.schema"),
    "regex": StructuredOutput("regex", r"(ab|c[de]){1,3}-[0-9]{2,6}", "guided_regex"),
    "choice": choice_output(["red", "green", "blue"], "guided_choice"),
    "tool_call": tool_call_output([{"name": "lookup", "parameters": SCHEMA}, {"name": "noop"}], True, "tool_choice"),
}
CONSTRAINED = {name: SamplingParams(max_tokens=40, structured=output) for name, output in CONSTRAINTS.items()} | {
    f"{name}_sampled": SamplingParams(max_tokens=40, structured=output, temperature=1.0, seed=7)
    for name, output in CONSTRAINTS.items()
}
JSON_GREEDY = CONSTRAINED["json"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def loaded(family: str) -> LoadedModel:
    return load_model(speculation_checkpoints(family).target, dtype="float64")


@functools.cache
def runner_for(family: str, mode: str) -> ModelRunner:
    return new_runner(family, mode)


def new_runner(family: str, mode: str) -> ModelRunner:
    """A runner of its own, for a test that changes its drafter (runner_for's are shared)."""
    model = loaded(family)
    options = DraftOptions(draft=speculation_checkpoints(family).dflash if mode in ("dflash", "tree") else None)
    runner = ModelRunner(model.decoder, model.checkpoint.eos_token_ids, load_drafter(mode, model, options))
    runner.grammar_masks = grammar_masks(family)
    return runner


@functools.cache
def grammar_masks(family: str) -> GrammarMasks:
    return GrammarMasks.for_model(loaded(family))


def make_prompts(vocab_size: int, count: int, seed: int) -> list[list[int]]:
    """A third repeat a short pattern, a third are random, a third repeat a random chunk."""
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        if i % 3 == 0:
            pattern = [rng.randrange(3, vocab_size) for _ in range(rng.randint(2, 5))]
            prompts.append((pattern * 12)[: rng.randint(6, 30)])
        elif i % 3 == 1:
            prompts.append([rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 40))])
        else:
            chunk = [rng.randrange(3, vocab_size) for _ in range(rng.randint(3, 8))]
            middle = [rng.randrange(3, vocab_size) for _ in range(rng.randint(1, 6))]
            prompts.append(chunk + middle + chunk)
    return prompts


def decode(runner: ModelRunner, prompt_ids: list[int], params: SamplingParams, stats: SpecStats) -> list[int]:
    sequence = runner.start("lossless", prompt_ids, params)
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        runner.decode_step(sequence)
    stats.merge(sequence.stats)
    return sequence.output_ids


@functools.cache
def outputs(family: str, mode: str, params_name: str, num_prompts: int) -> tuple[list[list[int]], SpecStats]:
    params = ({"greedy": GREEDY, "penalized": PENALIZED} | CONSTRAINED).get(params_name) or biased_params(family)
    prompts = make_prompts(loaded(family).config.vocab_size, num_prompts, seed=FAMILIES.index(family))
    stats = SpecStats()
    return [decode(runner_for(family, mode), prompt, params, stats) for prompt in prompts], stats


@functools.cache
def biased_params(family: str) -> SamplingParams:
    """Greedy with the tokens plain decoding likes best banned and a few others favoured: a bias
    that changes what greedy decoding emits (checked in the test), so a verifier that took the
    raw argmax would disagree with plain decoding."""
    expected, _ = outputs(family, "none", "greedy", 4)
    counts: dict[int, int] = {}
    for token in (t for tokens in expected for t in tokens):
        counts[token] = counts.get(token, 0) + 1
    banned = sorted(counts, key=counts.get, reverse=True)[:NUM_BANNED]
    favoured = [t for t in range(3, 40) if t not in banned][:3]
    return SamplingParams(
        max_tokens=32, ignore_eos=True, logit_bias={**{t: -100.0 for t in banned}, **{t: 1.5 for t in favoured}}
    )


def assert_same_tokens(expected: list[list[int]], got: list[list[int]], mode: str) -> None:
    for index, (want, have) in enumerate(zip(expected, got, strict=True)):
        first = next((i for i, (a, b) in enumerate(zip(want, have)) if a != b), None)
        assert want == have, f"mode {mode}, prompt {index}: first difference at output token {first}"


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_plain_decoding(family, mode):
    expected, _ = outputs(family, "none", "greedy", NUM_PROMPTS)
    got, stats = outputs(family, mode, "greedy", NUM_PROMPTS)
    assert_same_tokens(expected, got, mode)
    assert stats.draft_tokens > 0, "the drafter never proposed anything: the test would prove nothing"
    assert stats.generated_tokens == NUM_PROMPTS * GREEDY.max_tokens
    # Each forward emits its accepted drafts plus one token (the last step may be cut at max_tokens).
    assert stats.target_forwards <= stats.generated_tokens <= stats.accepted_tokens + stats.target_forwards


@pytest.mark.parametrize("mode", ["ngram", "suffix"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lookup_drafts_are_accepted_on_self_repeating_prompts(family, mode):
    _, stats = outputs(family, mode, "greedy", NUM_PROMPTS)
    assert stats.accepted_tokens > 0
    assert stats.tokens_per_forward > 1.0


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_penalties_equals_plain_decoding(family, mode):
    expected, _ = outputs(family, "none", "penalized", 4)
    got, _ = outputs(family, mode, "penalized", 4)
    assert_same_tokens(expected, got, mode)


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_with_logit_bias_equals_plain_decoding(family, mode):
    expected, _ = outputs(family, "none", "biased", 4)
    banned = {t for t, bias in biased_params(family).logit_bias.items() if bias < 0}
    assert not banned & {t for tokens in expected for t in tokens}, "a banned token was emitted"
    assert_same_tokens(expected, outputs(family, mode, "biased", 4)[0], mode)


def assert_within_grammar(family: str, output: StructuredOutput, outputs: list[list[int]]) -> int:
    """Each output is accepted, token by token, by a fresh llguidance matcher, and one that ended
    on EOS is complete (and, for a schema, validates). Checked on plain decoding's output, so a
    verifier that skipped the mask fails here too. Returns how many were complete."""
    import jsonschema
    import llguidance

    model = loaded(family)
    eos_ids = model.checkpoint.eos_token_ids
    tokenizer = llguidance.LLTokenizer(model.tokenizer.to_str(), n_vocab=model.config.vocab_size, eos_token=eos_ids)
    complete = 0
    for tokens in outputs:
        ended = bool(tokens) and tokens[-1] in eos_ids
        matcher = llguidance.LLMatcher(tokenizer, output.check(), log_level=0)
        assert matcher.consume_tokens(tokens[:-1] if ended else tokens), matcher.get_error()
        if ended:
            assert matcher.is_accepting(), "EOS before the grammar was complete"
            complete += 1
            if output.kind == "json_schema":
                jsonschema.validate(json.loads(model.tokenizer.decode(tokens[:-1])), SCHEMA)
    return complete


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("params_name", ["json", "json_sampled"])
@pytest.mark.parametrize("family", FAMILIES)
def test_json_mode_writes_json_and_equals_plain_decoding(family, params_name, mode):
    """Every mode emits plain decoding's very tokens, drawn or greedy, and they are JSON."""
    expected, _ = outputs(family, "none", params_name, 6)
    assert_within_grammar(family, CONSTRAINTS["json"], expected)
    got, stats = outputs(family, mode, params_name, 6)
    assert_same_tokens(expected, got, mode)
    assert stats.draft_tokens > 0


@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("kind", ["schema", "regex", "choice", "tool_call"])
@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
def test_every_kind_of_constraint_is_lossless_under_speculation(kind, sampled, mode):
    family = FAMILIES[0]
    params_name = f"{kind}_sampled" if sampled else kind
    expected, _ = outputs(family, "none", params_name, 4)
    assert_within_grammar(family, CONSTRAINTS[kind], expected)
    assert_same_tokens(expected, outputs(family, mode, params_name, 4)[0], mode)


def test_short_grammars_run_to_completion_and_end_on_eos():
    """A choice or a regex a random model completes within its budget: EOS right after."""
    family = FAMILIES[0]
    for kind in ("choice", "regex"):
        expected, _ = outputs(family, "none", kind, 4)
        assert assert_within_grammar(family, CONSTRAINTS[kind], expected) == 4, kind


@pytest.mark.parametrize("mode", MODES)
def test_min_tokens_holds_the_stop_tokens_back_and_speculation_still_equals_plain_decoding(mode):
    """Plain greedy decoding's own tokens become stop ids: without min_tokens every prompt ends at
    its first token; with it, none ends before min_tokens, and every mode emits the same tokens."""
    family = FAMILIES[0]
    expected, _ = outputs(family, "none", "greedy", 4)
    stops = sorted({tokens[0] for tokens in expected} | {tokens[5] for tokens in expected})
    prompts = make_prompts(loaded(family).config.vocab_size, 4, seed=FAMILIES.index(family))
    stats = SpecStats()

    def run(runner_mode: str, min_tokens: int) -> list[list[int]]:
        params = SamplingParams(max_tokens=24, stop_token_ids=stops, min_tokens=min_tokens)
        return [decode(runner_for(family, runner_mode), prompt, params, stats) for prompt in prompts]

    assert all(len(tokens) == 1 for tokens in run("none", 0))
    held = run("none", 12)
    assert all(len(tokens) > 12 and not set(tokens[:12]) & set(stops) for tokens in held)
    assert_same_tokens(held, run(mode, 12), mode)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES[1:])
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_equal_plain_decoding_many_prompts(family, mode):
    expected, _ = outputs(family, "none", "greedy", 40)
    got, _ = outputs(family, mode, "greedy", 40)
    assert_same_tokens(expected, got, mode)


@pytest.mark.parametrize("mode", ["none", "ngram", "suffix"])
def test_a_json_mode_sequence_resumed_after_a_crash_goes_on_as_if_uninterrupted(mode):
    """Crash recovery replays the tokens a dead worker emitted as `resumed_ids`: the JSON state is
    rebuilt from them, so the rest is what the uninterrupted run wrote."""
    family = FAMILIES[0]
    runner = runner_for(family, mode)
    prompt = make_prompts(loaded(family).config.vocab_size, 1, seed=5)[0]
    whole = decode(runner, prompt, JSON_GREEDY, SpecStats())
    assert len(whole) > 12
    sequence = runner.start("resumed", prompt, JSON_GREEDY, resumed_ids=whole[:9])
    while sequence.num_to_prefill > 0:
        runner.prefill(sequence, PREFILL_CHUNK)
    while not sequence.finished:
        runner.decode_step(sequence)
    assert sequence.output_ids == whole
