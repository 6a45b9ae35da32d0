"""Structured outputs' masks per row: llguidance's own matcher stepped token by token is the oracle,
for committed tokens and for draft paths consumed and rolled back; the end of text once the grammar
is complete; nothing masked while the answer is still reasoning."""

from __future__ import annotations

import llguidance
import pytest
import torch

from shared.structured_output import StructuredOutput, choice_output, json_schema_output
from tests.support.tiny_models import train_tokenizer
from worker.engine.grammar_constraint import AnswerStart, GrammarConstraint, GrammarMasks, GrammarViolation

TOKENIZER = train_tokenizer()
EOS = TOKENIZER.token_to_id("<|im_end|>")
VOCAB_SIZE = TOKENIZER.get_vocab_size() + 8  # the model's logits are wider than the tokenizer's vocabulary
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
    "required": ["name", "n"],
    "additionalProperties": False,
}
DOCUMENT = '{"name":"the fox","n":42}'  # compact, as the default whitespace asks


def masks() -> GrammarMasks:
    return GrammarMasks(TOKENIZER.to_str(), VOCAB_SIZE, eos_ids=[EOS], device="cpu")


def constraint(output: StructuredOutput, stop_ids=frozenset({EOS}), reasoning: bool = False) -> GrammarConstraint:
    shared = masks()
    answer_start = AnswerStart("</think>", lambda token_id: TOKENIZER.decode([token_id])) if reasoning else None
    return GrammarConstraint(shared, shared.compile(output.check()), stop_ids, answer_start)


def oracle_mask(output: StructuredOutput, tokens: list[int]) -> torch.Tensor:
    """llguidance's own matcher, fed `tokens` one by one: the allowed ids as a [vocab] bool mask."""
    tokenizer = llguidance.LLTokenizer(TOKENIZER.to_str(), n_vocab=VOCAB_SIZE, eos_token=EOS)
    matcher = llguidance.LLMatcher(tokenizer, output.check(), log_level=0)
    for token in tokens:
        assert matcher.consume_token(token), matcher.get_error()
    bitmask = matcher.compute_bitmask()
    return torch.tensor([bool(bitmask[i // 8] >> (i % 8) & 1) for i in range(VOCAB_SIZE)])


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False).ids


def test_the_mask_at_every_committed_step_is_the_engines_own():
    output = json_schema_output(SCHEMA, "response_format")
    tokens = ids(DOCUMENT)
    lane = constraint(output)
    for step in range(len(tokens)):
        mask = lane.mask(tokens[:step], step)
        assert torch.equal(mask, oracle_mask(output, tokens[:step])), step
        assert mask[tokens[step]], f"the document's own token {tokens[step]} is allowed at step {step}"


def test_a_draft_row_is_masked_from_its_own_path_and_the_committed_state_is_untouched():
    output = json_schema_output(SCHEMA, "response_format")
    tokens = ids(DOCUMENT)
    lane = constraint(output)
    committed = 3
    root_before = lane.mask(tokens[:committed], committed)
    for depth in range(1, 5):
        row = lane.mask(tokens[: committed + depth], committed)
        assert torch.equal(row, oracle_mask(output, tokens[: committed + depth])), depth
    assert torch.equal(lane.mask(tokens[:committed], committed), root_before), "drafts are rolled back"


def test_a_complete_answer_allows_only_the_stop_ids_and_the_model_eos_without_them():
    output = choice_output(["yes", "no"], "guided_choice")
    done = ids("yes")
    assert lane_allowed(constraint(output, stop_ids={EOS, 7}), done) == sorted([7, EOS])
    assert lane_allowed(constraint(output, stop_ids=frozenset()), done) == [EOS]  # ignore_eos
    past_the_end = constraint(output, stop_ids=frozenset())
    assert past_the_end.mask([*done, EOS], len(done) + 1).nonzero().flatten().tolist() == [EOS]


def lane_allowed(lane: GrammarConstraint, tokens: list[int]) -> list[int]:
    return lane.mask(tokens, len(tokens)).nonzero().flatten().tolist()


def test_the_constraint_starts_after_the_think_block_closes():
    output = choice_output(["yes", "no"], "guided_choice")
    close = ids("</think>")
    assert len(close) > 1, "the tag spans tokens here, so it is found in their text"
    thinking = ids("<think>hmm, the fox")
    lane = constraint(output, reasoning=True)
    assert lane.mask(thinking, len(thinking)) is None, "reasoning is not constrained"
    after = thinking + close
    assert torch.equal(lane.mask(after, len(thinking)), oracle_mask(output, [])), "a draft that closes the block"
    assert lane.mask(thinking + close[:1], len(thinking)) is None, "a rolled-back draft does not start the answer"
    assert lane.mask(after, len(after)) is not None
    assert torch.equal(lane.mask(after + ids("y"), len(after) + 1), oracle_mask(output, ids("y")))


def test_a_committed_token_the_grammar_refuses_breaks_the_lane_loudly():
    lane = constraint(choice_output(["yes", "no"], "guided_choice"))
    with pytest.raises(GrammarViolation, match="breaks the grammar"):
        lane.mask(ids("maybe"), len(ids("maybe")))


def test_a_grammar_compiles_once_per_model_and_each_sequence_gets_its_own_matcher():
    shared = masks()
    grammar = StructuredOutput("regex", r"[ab]{2}", "guided_regex").check()
    first, second = shared.compile(grammar), shared.compile(grammar)
    assert shared.is_compiled(grammar) and first is not second
    assert first.consume_token(ids("a")[0])
    assert torch.equal(
        shared.unpack(second.compute_bitmask()), shared.unpack(shared.compile(grammar).compute_bitmask())
    )


def test_json_mode_allows_no_whitespace_by_default():
    lane = constraint(StructuredOutput("json_object", "", "response_format"))
    space_ids = {i for i in range(TOKENIZER.get_vocab_size()) if TOKENIZER.decode([i]).strip() == ""}
    opened = ids('{"a":')
    allowed = set(lane.mask(opened, len(opened)).nonzero().flatten().tolist())
    assert allowed and not allowed & space_ids


def test_flexible_json_mode_caps_whitespace_runs():
    output = StructuredOutput("json_object", "", "response_format", whitespace="flexible")
    lane = constraint(output)
    spaces = ids("{" + " " * 16)
    space_ids = set(ids(" ")) | {i for i in range(TOKENIZER.get_vocab_size()) if TOKENIZER.decode([i]).strip() == ""}
    allowed = lane.mask(spaces, len(spaces)).nonzero().flatten().tolist()
    assert not set(allowed) & space_ids, "no seventeenth whitespace character"
    fewer = constraint(output).mask(spaces[:-1], len(spaces) - 1)
    assert set(fewer.nonzero().flatten().tolist()) & space_ids, "fourteen may be followed by more"
