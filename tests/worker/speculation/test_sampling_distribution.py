"""Speculative sampling reproduces plain sampling's distribution.

A small-vocabulary target (16 tokens) lets the test enumerate the exact marginal distribution of
each of the first three generated tokens under the request's processing (temperature, top-p).
Plain, chain, tree and suffix-decoding sampling are then each checked against it with a
chi-square test; a control shows the sample size detects a 5% shift of probability mass. The
drafts come from the target's own distributions (greedy path, top-4 per depth; for suffix
decoding, a tree of outputs sampled from them), so they are accepted often but not always, and
both the accept and the reject branch of every walk get exercised. The model also carries a
random MTP head in its checkpoint, so the head's own best-first trees (`mtp-tree`, and `auto`
choosing between the head's chains and trees and the suffix) are checked the same way.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import make_tiny_model_with_mtp, one_torch_thread
from worker.drafters.registry import DraftOptions, load_drafter
from worker.drafters.suffix import SuffixDrafter, SuffixOptions
from worker.engine.drafter_protocol import Drafter, TargetStates
from worker.engine.logits_processing import process_logits
from worker.engine.runner import ModelRunner
from worker.engine.sequence import Sequence
from worker.models.loader import LoadedModel, load_model
from worker.speculation.tree import DraftTree, build_best_first_tree

VOCAB_SIZE = 16
PROMPT = [5]  # one token: the cache starts empty, so a sample costs decode steps only
NUM_POSITIONS = 3
NUM_SAMPLES = 1500  # detects a 5% shift at p < 1e-5 on this model; the last test checks that
PARAMS = dict(max_tokens=NUM_POSITIONS, temperature=1.0, top_p=0.95, ignore_eos=True)
Table = dict[tuple[int, ...], torch.Tensor]  # generated prefix -> next-token probabilities [V]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> LoadedModel:
    folder = make_tiny_model_with_mtp(
        tmp_path_factory.mktemp("small-vocab"), "qwen3", seed=3, vocab_size=VOCAB_SIZE, num_hidden_layers=1
    )
    return load_model(folder, dtype="float64")


@pytest.fixture(scope="module")
def table(model) -> Table:
    return exact_table(model)


def exact_table(model: LoadedModel) -> Table:
    """The processed next-token distribution after every generated prefix of length < NUM_POSITIONS."""
    params = SamplingParams(**PARAMS)
    probs: Table = {}
    frontier: list[tuple[int, ...]] = [()]
    for _ in range(NUM_POSITIONS):
        for prefix in frontier:
            token_ids = PROMPT + list(prefix)
            cache = model.decoder.new_cache(len(token_ids))
            logits = model.decoder(torch.tensor(token_ids), torch.arange(len(token_ids)), cache, num_logits=1).logits
            processed = process_logits(logits, params, PROMPT, [list(prefix)])[0]
            probs[prefix] = torch.softmax(processed, dim=-1)
        frontier = [prefix + (t,) for prefix in frontier for t in range(VOCAB_SIZE) if probs[prefix][t] > 0]
    return probs


def exact_marginals(table: Table) -> list[torch.Tensor]:
    """P(token at position j) for j < NUM_POSITIONS, summing over every prefix."""
    marginals = []
    weights = {(): 1.0}
    for _ in range(NUM_POSITIONS):
        marginal = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
        next_weights = {}
        for prefix, weight in weights.items():
            marginal += weight * table[prefix]
            for token in torch.nonzero(table[prefix]).flatten().tolist():
                next_weights[prefix + (token,)] = weight * float(table[prefix][token])
        marginals.append(marginal)
        weights = next_weights
    return marginals


class TableDrafter:
    """Drafts from the target's exact distributions: the greedy path, or a best-first tree over
    the top-4 tokens at each depth of it. Proposals beyond the table are cut off."""

    name = "table"
    hidden_layers: tuple[int, ...] = ()
    wants_final_hidden = False

    def __init__(self, table: Table, depth: int, tree_budget: int | None):
        self.table, self.depth, self.tree_budget = table, depth, tree_budget

    def start(self, sequence: Sequence) -> None:
        return None

    def observe(self, state: None, committed: TargetStates) -> None:
        pass

    def propose(self, state: None, sequence: Sequence) -> DraftTree | None:
        prefix = tuple(sequence.output_ids)
        candidates = []
        while len(candidates) < self.depth and prefix in self.table:
            top = torch.topk(torch.log(self.table[prefix]), 4)
            candidates.append(
                [(t, min(lp, 0.0)) for t, lp in zip(top.indices.tolist(), top.values.tolist()) if lp > -math.inf]
            )
            prefix = prefix + (candidates[-1][0][0],)
        if not candidates:
            return None
        if self.tree_budget is None:
            return DraftTree.chain([ranked[0][0] for ranked in candidates])
        return build_best_first_tree(candidates, self.tree_budget)

    def state_bytes(self, state: None) -> int:
        return 0


def suffix_drafter(table: Table) -> SuffixDrafter:
    """Suffix decoding whose tree of recent outputs holds 200 answers sampled from the target's
    exact distributions (prompt token in front, so the request's tail matches them): frequency-
    scored trees that are right often, not always. Finished samples join the tree as they come."""
    drafter = SuffixDrafter(SuffixOptions(max_nodes=8, spec_factor=3.0, min_prob=0.02))
    rng = random.Random(0)
    for index in range(200):
        prefix: tuple[int, ...] = ()
        while prefix in table:
            prefix += tuple(rng.choices(range(VOCAB_SIZE), weights=table[prefix].tolist()))
        drafter.global_tree.add(f"seed-{index}", PROMPT + list(prefix))
    return drafter


def make_drafter(name: str, table: Table, model: LoadedModel) -> Drafter:
    if name in HEAD_MODES:
        drafter = load_drafter(name, model, DraftOptions())
        assert drafter is not None
        return drafter
    return suffix_drafter(table) if name == "suffix" else TableDrafter(table, **DRAFTERS[name])


def sample_outputs(model: LoadedModel, drafter: Drafter | None) -> list[list[int]]:
    runner = ModelRunner(model.decoder, [], drafter)
    outputs = []
    for seed in range(NUM_SAMPLES):
        sequence = runner.start("sample", PROMPT, SamplingParams(seed=seed, **PARAMS))
        while not sequence.finished:
            runner.decode_step(sequence)
        outputs.append(sequence.output_ids)
    return outputs


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit of `counts` to `probs` (both [V]); bins expecting < 5 are pooled."""
    expected = probs * counts.sum()
    assert counts[expected == 0].sum() == 0, "a token with probability zero was sampled"
    small = (expected > 0) & (expected < 5)
    observed_bins = torch.cat([counts[expected >= 5], counts[small].sum().reshape(1)])
    expected_bins = torch.cat([expected[expected >= 5], expected[small].sum().reshape(1)])
    keep = expected_bins > 0
    observed_bins, expected_bins = observed_bins[keep], expected_bins[keep]
    statistic = float(((observed_bins - expected_bins) ** 2 / expected_bins).sum())
    dof = observed_bins.numel() - 1
    # Survival function of chi2(dof) = regularized upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(statistic / 2)))


def position_counts(outputs: list[list[int]], position: int) -> torch.Tensor:
    counts = torch.zeros(VOCAB_SIZE, dtype=torch.float64)
    for tokens in outputs:
        counts[tokens[position]] += 1
    return counts


@pytest.fixture(scope="module")
def plain_outputs(model) -> list[list[int]]:
    return sample_outputs(model, None)


DRAFTERS = {"chain": dict(depth=3, tree_budget=None), "tree": dict(depth=3, tree_budget=8)}
HEAD_MODES = ("mtp-tree", "auto")  # drafts from the checkpoint's MTP head (auto: or the suffix trees)
MODES = [*sorted(DRAFTERS), "suffix", *HEAD_MODES]


@pytest.fixture(scope="module", params=MODES)
def speculative(request, model, table) -> tuple[str, list[list[int]], Drafter]:
    drafter = make_drafter(request.param, table, model)
    return request.param, sample_outputs(model, drafter), drafter


def test_the_target_is_not_degenerate(table):
    # The test means something only if several tokens are likely at each position.
    for probs in exact_marginals(table):
        assert (probs > 0.05).sum() >= 3, probs


def test_plain_sampling_matches_the_exact_marginals(table, plain_outputs):
    for position, probs in enumerate(exact_marginals(table)):
        assert chi_square_p_value(position_counts(plain_outputs, position), probs) > 1e-3, position


def test_speculative_sampling_matches_the_exact_marginals(table, speculative):
    mode, outputs, _ = speculative
    for position, probs in enumerate(exact_marginals(table)):
        p_value = chi_square_p_value(position_counts(outputs, position), probs)
        assert p_value > 1e-3, f"{mode}: position {position}, p={p_value:.2e}"


def test_speculative_sampling_accepts_drafts(model, table):
    # A drafter that is never accepted would make the distribution test vacuous.
    for mode in MODES:
        runner = ModelRunner(model.decoder, [], make_drafter(mode, table, model))
        accepted = rejected = 0
        for seed in range(50):
            sequence = runner.start("accept", PROMPT, SamplingParams(seed=seed, **PARAMS))
            while not sequence.finished:
                runner.decode_step(sequence)
            accepted += sequence.stats.accepted_tokens
            rejected += sequence.stats.drafts - (sequence.stats.accepted_per_depth or [0])[0]
        assert accepted >= (10 if mode in HEAD_MODES else 25), mode  # a random head guesses worse than the table
        assert rejected > 0, mode  # drafts whose first token was rejected: the other branch


def test_seeded_speculative_sampling_emits_the_plain_tokens_draw_for_draw(plain_outputs, speculative):
    # One uniform per emitted token, drawn from the same processed distribution: the same seed
    # gives the same tokens whatever the drafts were.
    mode, outputs, _ = speculative
    assert outputs == plain_outputs, mode


def test_the_sample_size_detects_a_five_percent_bias(table, plain_outputs):
    for position, probs in enumerate(exact_marginals(table)):
        order = torch.argsort(probs, descending=True)
        biased = probs.clone()
        biased[order[0]] -= 0.05
        biased[order[1]] += 0.05
        p_value = chi_square_p_value(position_counts(plain_outputs, position), biased)
        assert p_value < 1e-4, f"position {position}: a 5% shift went unnoticed (p={p_value:.2e})"
