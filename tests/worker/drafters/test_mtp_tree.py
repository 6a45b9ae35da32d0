"""Trees from the MTP head, and what a dormant head costs.

A tree's nodes are checked against an independent recomputation (the head's layer as transformers'
own decoder layer, over the whole path from scratch): each node's children are the head's
likeliest tokens after that node's path, best first. A head that does not draft for a stretch
runs no rows during it and a bounded number when it drafts again, and the output stays plain
decoding's.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from shared.sampling import SamplingParams
from tests.support.tiny_drafters import speculation_checkpoints
from tests.worker.drafters.test_mtp import PROMPT, Reference, _run_prefill, mtp_folder, target, without_embedded_head
from worker.drafters.head_rows import HeadRows
from worker.drafters.mtp import RESTART_CONTEXT, MtpDrafter
from worker.drafters.picker import SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.runner import ModelRunner
from worker.speculation.tree import ROOT, DraftTree


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    from tests.support.tiny_drafters import one_torch_thread

    with one_torch_thread():
        yield


def reference_output(reference: Reference, committed: list[int], root: int, path: list[int]) -> torch.Tensor:
    """[hidden]: the head's normed output after root + path (its logits guess the next token), from scratch."""
    hidden = reference._target_hidden(committed)  # [L, hidden]
    next_ids = committed[1:] + [root]
    g = reference._head(torch.tensor(next_ids), hidden)
    for token in path:
        next_ids, hidden = next_ids + [token], torch.cat([hidden, g[-1:]])
        g = reference._head(torch.tensor(next_ids), hidden)
    return g[-1]


def reference_top(reference: Reference, committed: list[int], root: int, path: list[int], k: int) -> list[int]:
    """The head's k likeliest tokens after root + path, recomputed from scratch."""
    return reference.target.lm_head(reference_output(reference, committed, root, path)).topk(k).indices.tolist()


def recording_tree_rows(drafter: MtpDrafter) -> list[tuple[list[int], torch.Tensor]]:
    """(path, head output) of every tree row the drafter runs from now on; a row's path is the
    tokens of the rows in the scratch slots it sees, then its own."""
    rows: list[tuple[list[int], torch.Tensor]] = []
    run_head = drafter.run_head

    def recording(lanes: list[HeadRows], hidden: torch.Tensor) -> torch.Tensor:
        out = run_head(lanes, hidden)
        first = 0
        for lane in lanes:
            if lane.scratch is not None:
                if lane.start == lane.cache.length:  # the tree's first forward: its scratch starts empty
                    slot_tokens.clear()
                for row in range(lane.num_rows):
                    slot_tokens[lane.start + row] = lane.token_ids[row]
                    path = [slot_tokens[slot] for slot in lane.scratch[row]] + [lane.token_ids[row]]
                    rows.append((path, out[first + row]))
            first += lane.num_rows
        return out

    slot_tokens: dict[int, int] = {}
    drafter.run_head = recording  # type: ignore[method-assign]
    return rows


def children(tree: DraftTree, node: int) -> list[int]:
    return [tree.tokens[i] for i, parent in enumerate(tree.parents) if parent == node]


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_each_nodes_children_are_the_heads_likeliest_after_its_path(tmp_path, family):
    folder = speculation_checkpoints(family).target
    head = mtp_folder(tmp_path, family, seed=11)
    reference = Reference(folder, load_file(str(head / "model.safetensors")), "post_norm")
    model = without_embedded_head(target(family))
    drafter = load_drafter("mtp-tree", model, DraftOptions(draft=head, tree_budget=8, tree_top_k=3))
    assert isinstance(drafter, MtpDrafter) and drafter.name == "mtp-tree"
    runner, sequence = _run_prefill(model, drafter)
    rows = recording_tree_rows(drafter)
    branched = deep = 0
    for _ in range(3):  # after the prefill, then after decode steps that committed trees' paths
        rows.clear()
        tree = drafter.propose(sequence.drafter_state, sequence)
        assert tree is not None and tree.num_nodes == 8
        committed, root = sequence.token_ids[:-1], sequence.root_token
        for path, output in rows:  # every row grown, siblings and cousins in one forward
            torch.testing.assert_close(output, reference_output(reference, committed, root, path), rtol=0, atol=1e-5)
            deep += len(path) > 1
        for node in [ROOT, *range(tree.num_nodes)]:
            path = [] if node == ROOT else [tree.tokens[i] for i in tree.path_to(node)]
            got = children(tree, node)
            if got:
                assert got == reference_top(reference, committed, root, path, 3)[: len(got)], (node, path)
        branched += not tree.is_chain
        assert sequence.drafter_state.cache.length == sequence.cache.length  # scratch slots only
        runner.decode_step(sequence)
    assert branched, "a random head is unsure: its trees branch"
    assert deep, "rows below depth 1 were grown (they see their ancestors' scratch slots only)"


def test_a_top1_tree_is_the_chain():
    model = target("qwen3")
    chain = load_drafter("mtp", model, DraftOptions(num_draft=4))
    tree = load_drafter("mtp-tree", model, DraftOptions(tree_budget=4, tree_top_k=1))
    assert isinstance(chain, MtpDrafter) and isinstance(tree, MtpDrafter)
    _, chained = _run_prefill(model, chain)
    _, treed = _run_prefill(model, tree)
    drafted = tree.propose(treed.drafter_state, treed)
    assert drafted is not None and drafted.is_chain
    assert drafted.tokens == chain.propose(chained.drafter_state, chained).tokens


GREEDY = SamplingParams(max_tokens=100, ignore_eos=True)
DORMANT_STEPS = 60  # longer than RESTART_CONTEXT: replaying it would cost more rows than a restart


def test_a_dormant_head_runs_no_rows_and_a_bounded_number_when_it_drafts_again():
    model = target("qwen3")
    plain = ModelRunner(model.decoder, [], None)
    expected = plain.start("plain", PROMPT, GREEDY)
    while not expected.finished:
        plain.prefill(expected, 64) if expected.num_to_prefill else plain.decode_step(expected)
    drafter = load_drafter("mtp", model, DraftOptions())
    assert isinstance(drafter, MtpDrafter)
    runner = ModelRunner(model.decoder, [], drafter)
    sequence = runner.start("dormant", PROMPT, GREEDY)
    runner.prefill(sequence, 64)
    state = sequence.drafter_state
    for _ in range(3):
        runner.decode_step(sequence)
    sequence.draft_limit = 0  # adaptive speculation: nothing pays at this load
    before = state.head_rows
    for _ in range(DORMANT_STEPS):
        runner.decode_step(sequence)
    assert state.head_rows == before, "a dormant head ran rows"
    assert state.num_observed - state.num_paired >= DORMANT_STEPS
    sequence.draft_limit = None
    runner.decode_step(sequence)  # catch up (the latest pairs), draft, observe the step eagerly
    chain_rows, observed_rows = drafter.num_draft - 1, drafter.num_draft + 1
    assert 0 < state.head_rows - before <= RESTART_CONTEXT + chain_rows + observed_rows
    while not sequence.finished:
        runner.decode_step(sequence)
    assert sequence.output_ids == expected.output_ids


def test_under_auto_the_head_sleeps_while_the_suffix_drafts():
    model = target("qwen3")
    auto = ModelRunner(model.decoder, [], load_drafter("auto", model, DraftOptions()))
    picker = auto.drafter
    assert isinstance(picker, SourcePicker)
    params = SamplingParams(max_tokens=60, ignore_eos=True)
    outputs = []
    for request in ("teach", "again"):  # the second one's text is in the suffix trees: they draft it
        sequence = auto.start(request, PROMPT, params)
        while sequence.num_to_prefill:
            auto.prefill(sequence, 64)
        sleeping_steps, head_drafted = 0, True
        while not sequence.finished:
            rows = sequence.drafter_state.model.head_rows
            head = sequence.stats.by_source.get("mtp")
            drafts_before = head.drafts if head is not None else 0
            auto.decode_step(sequence)
            head = sequence.stats.by_source.get("mtp")
            drafted_now = (head.drafts if head is not None else 0) > drafts_before
            if not drafted_now and not head_drafted:  # neither this step nor the last: asleep
                assert sequence.drafter_state.model.head_rows == rows
                sleeping_steps += 1
            head_drafted = drafted_now
        outputs.append(sequence.output_ids)
    assert sleeping_steps >= 4, "the suffix drafted the repeated request while the head slept"
    assert outputs[0] == outputs[1]


def test_a_prefix_snapshot_after_a_restart_drafts_what_a_cold_lane_drafts():
    """A head that skipped pairs has a hole in its cache; a snapshot of a prefix past the hole keeps
    the slots before it, and the lane importing it runs the rest as its prompt: it drafts as a lane
    that prefilled the same tokens cold."""
    model = target("qwen3")
    drafter = load_drafter("mtp", model, DraftOptions())
    assert isinstance(drafter, MtpDrafter)
    runner = ModelRunner(model.decoder, [], drafter)
    origin = runner.start("origin", PROMPT, GREEDY)
    runner.prefill(origin, 64)
    runner.decode_step(origin)
    origin.draft_limit = 0
    for _ in range(DORMANT_STEPS):
        runner.decode_step(origin)
    origin.draft_limit = None
    runner.decode_step(origin)  # the restart: the pairs before the latest RESTART_CONTEXT are skipped
    state = origin.drafter_state
    assert state.slot_positions != list(range(len(state.slot_positions))), "a hole"
    num_tokens = origin.cache.length
    prompt = origin.token_ids[: num_tokens + 1]
    target_half, snapshot = runner.export_prefix(origin, num_tokens)
    warm = runner.start("warm", prompt, GREEDY)
    runner.attach_prefix(warm, target_half, snapshot)
    cold = runner.start("cold", prompt, GREEDY)
    while cold.num_to_prefill:
        runner.prefill(cold, 64)
    warm_draft = drafter.propose(warm.drafter_state, warm)
    cold_draft = drafter.propose(cold.drafter_state, cold)
    assert warm_draft is not None and cold_draft is not None
    assert warm_draft.tokens == cold_draft.tokens
    torch.testing.assert_close(warm.drafter_state.next_hidden, cold.drafter_state.next_hidden, rtol=0, atol=1e-9)


def test_auto_drafts_the_heads_tree_where_rows_are_free():
    model = target("qwen3")
    runner = ModelRunner(model.decoder, [], load_drafter("auto", model, DraftOptions()))
    picker = runner.drafter
    assert isinstance(picker, SourcePicker) and picker.row_price == 0.0
    sequence = runner.start("fresh", PROMPT, GREEDY)  # nothing to match: the head drafts
    runner.prefill(sequence, 64)
    tree = picker.propose(sequence.drafter_state, sequence)
    assert tree is not None and tree.source == "mtp" and tree.num_nodes == 8 and not tree.is_chain
    picker.row_price = 0.4  # rows dear: a short chain is worth more than the tree
    tree = picker.propose(sequence.drafter_state, sequence)
    assert tree is not None and tree.is_chain and tree.num_nodes < 8
