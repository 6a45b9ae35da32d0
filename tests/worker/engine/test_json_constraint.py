"""JSON mode's masks per row: from committed tokens plus a draft path, cached by key, and only the
end of text once the object closes."""

from __future__ import annotations

import torch

from shared.sampling import SamplingParams
from worker.engine.json_constraint import JsonConstraint, JsonMasks
from worker.engine.logits_processing import greedy_token, process_logits

# id:       0     1     2      3     4     5     6      7      8     9
VOCAB = [None, b"{", b"}", b'"a"', b":", b" ", b"1", b'"}', b"ab", None]  # 0: EOS, 9: another special
EOS, OTHER_SPECIAL = 0, 9
VOCAB_SIZE = 12  # the model's logits are wider than the tokenizer's vocabulary


def masks() -> JsonMasks:
    return JsonMasks(lambda: list(VOCAB), VOCAB_SIZE, eos_ids=[EOS])


def allowed(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


def test_each_row_is_masked_by_the_state_its_own_history_reaches():
    constraint = JsonConstraint(masks(), stop_ids={EOS})
    assert allowed(constraint.mask([], 0)) == [1, 5]  # "{" or whitespace
    assert allowed(constraint.mask([1], 1)) == [2, 3, 5, 7]  # "}", a key, whitespace, a key starting with }
    # Committed: {"a"  — a draft path then adds ":" and " ": the row after it expects a value.
    assert allowed(constraint.mask([1, 3, 4, 5], 2)) == [1, 3, 5, 6, 7]
    assert allowed(constraint.mask([1, 3, 4, 6], 4)) == [2, 5, 6]  # after a number: more digits, "}", space
    # The object closed: the end of text only; unknown, special or out-of-vocabulary ids never.
    assert allowed(constraint.mask([1, 3, 4, 6, 2], 4)) == [EOS]


def test_a_closed_object_allows_the_model_eos_when_the_sequence_has_no_stop_ids():
    constraint = JsonConstraint(masks(), stop_ids=frozenset())  # ignore_eos
    assert allowed(constraint.mask([1, 2], 2)) == [EOS]
    assert allowed(constraint.mask([1, 2, EOS], 3)) == [EOS]  # past the end: still only the end


def test_masks_are_cached_by_key_and_shared_by_sequences():
    shared = masks()
    first = JsonConstraint(shared, {EOS}).mask([1, 3, 4], 3)
    again = JsonConstraint(shared, {EOS}).mask([1, 3, 4], 3)
    assert first is again


def test_the_masked_argmax_is_the_best_token_json_allows():
    logits = torch.tensor([[0.0, 1.0, 9.0, 2.0, 8.0, 0.5, 3.0, 7.0, 6.0, 10.0, 11.0, 12.0]])
    mask = JsonConstraint(masks(), {EOS}).mask([1], 1)
    out = process_logits(logits, SamplingParams(json_object=True), [5], [[1]], {EOS}, allowed=mask)
    assert greedy_token(out[0]) == 2  # "}" (9.0) beats the keys (2.0, 7.0); 9-11 score higher but are not JSON
    assert torch.isinf(out[0, [0, 1, 4, 6, 8, 9, 10, 11]]).all() and out[0, 7] == 7.0
