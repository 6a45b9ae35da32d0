"""EAGLE-3-style head training trains what the drafter runs: target states recomputed in batched
prefill equal the target's own one-sequence forward, the trainer's chain over the fused layers
equals the drafter's proposals (fed the layers by TargetStates, as the runner feeds them), and a
few updates lower the loss, on the CPU and (where torch sees one) on CUDA; the export loads in
`mtp` and `auto`."""

from __future__ import annotations

import argparse
import functools
import json
import random
import tempfile
from pathlib import Path

import pytest
import torch

from ops.training.capture import capture
from ops.training.engine_data import ShardSequence, shard_path, write_shard
from ops.training.train_drafter import _engine_sequences, _follow_shards
from ops.training.train_eagle3 import (
    Eagle3Trainer,
    answer_vocabulary,
    default_target_layers,
    target_states,
    warm_start_layers,
)
from ops.training.train_mtp import chain_hidden
from tests.ops.test_drafter_training import Progress, fake_sequence, perturbed
from tests.support.tiny_drafters import one_torch_thread, write_random_mtp
from tests.support.tiny_models import make_tiny_model
from worker.drafters.mtp import MtpDrafter
from worker.drafters.picker import SourcePicker
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import TargetStates
from worker.models.rope import RotaryEmbedding
from worker.serving_model import load_serving_model

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")),
]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def folder() -> Path:
    return make_tiny_model(Path(tempfile.mkdtemp(prefix="arbor-eagle3-train-")) / "tiny", "llama", num_hidden_layers=6)


def served():
    model = load_serving_model(folder(), "none")
    model.loaded.decoder.requires_grad_(False)
    return model


def shard_sequences(count: int, length: int, seed: int = 0) -> list[ShardSequence]:
    rng = random.Random(seed)
    vocab = 300  # the tiny tokenizer's
    return [
        ShardSequence(f"s/{i}", [rng.randrange(3, vocab) for _ in range(length)], length // 3) for i in range(count)
    ]


def test_the_default_layers_are_low_middle_and_high():
    assert default_target_layers(30) == (2, 15, 27)
    assert default_target_layers(6) == (2, 3)  # the middle and the high coincide: fused once


def test_the_vocabulary_keeps_the_answers_most_frequent_tokens_up_to_the_coverage():
    answers = [5] * 97 + [7, 7] + [9]  # 9: the last 1 % of the answer tokens
    sequences = [ShardSequence("a", [1, 2, *answers], 2)]
    assert answer_vocabulary(sequences, 10, extra=0, coverage=0.99).tolist() == [5, 7]
    assert answer_vocabulary(sequences, 10, extra=0, coverage=1.0).tolist() == [5, 7, 9]
    assert answer_vocabulary(sequences, 10, extra=1, coverage=0.5).tolist() == [5]  # 5 is the most frequent input too


def test_batched_prefill_states_equal_each_sequence_alone():
    model = served()
    layers = (1, 3, 5)
    windows = [s.token_ids for s in shard_sequences(3, 17)] + [shard_sequences(1, 9, seed=4)[0].token_ids]
    batched = target_states(model, windows, layers)
    for ids, states in zip(windows, batched, strict=True):
        alone = capture(model, [ids], layers)[0]
        torch.testing.assert_close(states.layer_hidden, alone.layer_hidden.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(states.final_hidden, alone.final_hidden.float(), atol=2e-2, rtol=2e-2)


def test_the_fused_chain_equals_the_drafters_own_proposals():
    model = served()
    trainer = Eagle3Trainer(model)
    trainer.config.target_layers = (0, 2, 5)
    trainer.setup({"train": shard_sequences(2, 20)})
    perturbed(trainer.model)
    drafter = trainer.drafter()
    prompt = shard_sequences(1, 12, seed=7)[0].token_ids
    root = 9
    first = target_states(model, [prompt], trainer.target_layers)[0]
    hidden = model.loaded.config.hidden_size
    layers = {
        layer: first.layer_hidden[:, i * hidden : (i + 1) * hidden] for i, layer in enumerate(trainer.target_layers)
    }
    sequence = fake_sequence(len(prompt))
    state = drafter.start(sequence)
    drafter.observe(state, TargetStates(prompt, 0, layers, None, root))
    proposal = drafter.propose(state, sequence).tokens
    trained_sequence = target_states(model, [prompt + [root] + proposal], trainer.target_layers)[0]
    rotary = RotaryEmbedding(model.loaded.decoder.config, torch.float32)
    with torch.no_grad():
        chain = chain_hidden(trainer.model, model, rotary, trained_sequence, 3)
    t = len(prompt) - 1
    vocabulary = drafter.vocabulary
    trained = [int(vocabulary.to_target(vocabulary.logits(chain[step][t]).argmax())) for step in range(3)]
    assert trained == proposal


@pytest.mark.parametrize("device", DEVICES)
def test_a_few_updates_lower_the_loss_and_the_export_loads(device, tmp_path):
    model = served()
    trainer = Eagle3Trainer(model, device)
    trainer.config.target_layers = (1, 3, 5)
    trainer.config.sequences_per_update = 4
    trainer.config.lr = 3e-3
    trainer.setup({"train": shard_sequences(4, 48, seed=3) * 2})
    assert next(trainer.model.parameters()).device.type == device
    losses = trainer.train(0, 30, 30, Progress())
    assert sum(losses[-5:]) / 5 < 0.95 * sum(losses[:5]) / 5, losses
    trainer.export(tmp_path / "eagle3")
    model.loaded.decoder.to("cpu")
    for mode in ("mtp", "auto"):
        drafter = load_drafter(mode, model.loaded, DraftOptions(draft=tmp_path / "eagle3"))
        head = drafter.model if isinstance(drafter, SourcePicker) else drafter
        assert isinstance(head, MtpDrafter) and head.hidden_layers == (1, 3, 5)
        assert torch.equal(head.vocabulary.token_ids, trainer.vocab.cpu())


def proposal(drafter, model, prompt: list[int], root: int) -> list[int]:
    """What `drafter` drafts after the target committed `prompt`, fed as the runner feeds it."""
    states = target_states(model, [prompt], tuple(range(model.loaded.config.num_hidden_layers)))[0]
    hidden = model.loaded.config.hidden_size
    layers = {layer: states.layer_hidden[:, layer * hidden : (layer + 1) * hidden] for layer in drafter.hidden_layers}
    sequence = fake_sequence(len(prompt))
    state = drafter.start(sequence)
    drafter.observe(state, TargetStates(prompt, 0, layers, states.final_hidden, root))
    return drafter.propose(state, sequence).tokens


@pytest.mark.parametrize("mtp_hidden", ["post_norm", "pre_norm"])
def test_a_warm_start_drafts_what_the_plain_head_drafts(mtp_hidden, tmp_path):
    model = served()
    plain = write_random_mtp(tmp_path / "plain", folder(), seed=5, mtp_hidden=mtp_hidden)
    vocab = list(range(3, 300, 2))
    (plain / "draft_vocab.json").write_text(json.dumps({"token_ids": vocab}))
    trainer = Eagle3Trainer(model, init_from=plain)
    assert trainer.target_layers == warm_start_layers(6) == (2, 3, 5)  # the last layer, which the plain head reads
    trainer.setup({"train": shard_sequences(2, 20)})
    answered = {t for s in shard_sequences(2, 20) for t in s.token_ids[s.prompt_length :]}
    assert set(trainer.vocab.tolist()) >= set(vocab) | answered  # its vocabulary, and what the data answers
    trainer.vocab = torch.tensor(vocab)  # as it starts: the plain head's vocabulary
    drafted = load_drafter("mtp", model.loaded, DraftOptions(draft=plain))
    prompts = [s.token_ids for s in shard_sequences(3, 14, seed=11)]
    warm = [proposal(trainer.drafter(), model, prompt, 9) for prompt in prompts]
    assert warm == [proposal(drafted, model, prompt, 9) for prompt in prompts]
    assert len({tuple(p) for p in warm}) > 1  # drafts that depend on the prompt: the check can fail
    trainer.export(tmp_path / "eagle3")  # and going on from the fused head keeps it as it is
    again = Eagle3Trainer(model, init_from=tmp_path / "eagle3")
    again.setup({"train": shard_sequences(2, 20)})
    assert again.target_layers == (2, 3, 5)
    exported = {name: t.to(torch.bfloat16).float() for name, t in trainer.model.state_dict().items()}  # bf16 on disk
    assert all(torch.equal(t, exported[name]) for name, t in again.model.state_dict().items())
    assert set(again.vocab.tolist()) >= set(vocab)  # the exported vocabulary, and the data's answers


def test_a_warm_start_refuses_what_is_not_a_head_of_the_target(tmp_path):
    broken = write_random_mtp(tmp_path / "broken", folder(), drop=["mtp.fc.weight"])
    with pytest.raises(SystemExit, match="not an MTP head of this target"):
        Eagle3Trainer(served(), init_from=broken)


class Written(Progress):
    def __init__(self):
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)


def test_training_takes_up_shards_a_generation_beside_it_finishes(tmp_path):
    """A shard finished since the last checkpoint joins the training data; with no new shard the
    folder is not read again."""
    engine = tmp_path / "engine"
    engine.mkdir()
    batches = [shard_sequences(3, 40, seed=seed) for seed in (5, 6)]

    def write(index: int) -> None:
        batch = batches[index]
        keys = [f"shard{index}-{i}" for i in range(len(batch))]
        write_shard(shard_path(engine, index), keys, [s.token_ids for s in batch], [s.prompt_length for s in batch])

    write(0)
    args = argparse.Namespace(data_dir=tmp_path, max_sequences=None)
    data = {"shards": 1, "train": _engine_sequences(args)}
    trainer = Eagle3Trainer(served())
    trainer.setup(data)
    progress = Written()
    first = data["train"]
    _follow_shards(trainer, args, data, 10, progress)
    assert data["train"] is first and trainer.num_sequences == 3 and not progress.lines
    write(1)
    _follow_shards(trainer, args, data, 20, progress)
    assert data["shards"] == 2 and trainer.num_sequences == 6
    assert [s.token_ids for s in data["train"]] == [s.token_ids for batch in batches for s in batch]
    assert progress.lines == ["update 20: training on the 6 sequences of 2 shards on disk"]
