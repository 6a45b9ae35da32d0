"""Drafter training trains what the drafters run: the trainers' batched forwards equal the
drafters' own step-by-step inference, a few updates lower the loss, and an exported drafter
(config.json + bf16 safetensors + draft_vocab.json) loads through the normal drafter path."""

from __future__ import annotations

import functools
import random
from pathlib import Path

import pytest
import torch

from ops.training.capture import capture
from ops.training.train_dflash import block_hidden
from ops.training.train_drafter import DFlashTrainer, MtpTrainer
from ops.training.train_mtp import chain_hidden
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_models import make_tiny_model
from worker.drafters.dflash import DFlashDrafter
from worker.drafters.mtp import MtpDrafter
from worker.drafters.registry import DraftOptions, load_drafter
from worker.engine.drafter_protocol import TargetStates
from worker.models.rope import RotaryEmbedding
from worker.serving_model import load_serving_model


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def served():
    folder = make_tiny_model(
        Path(__import__("tempfile").mkdtemp(prefix="arbor-train-")) / "tiny", "llama", num_hidden_layers=4
    )
    model = load_serving_model(folder, "none")
    model.loaded.decoder.requires_grad_(False)
    return model


def random_sequences(count: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    vocab = served().loaded.config.vocab_size
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(count)]


class Progress:
    def update(self, n):
        pass

    def set_postfix(self, **kwargs):
        pass


def perturbed(module: torch.nn.Module, seed: int = 1) -> None:
    """Away from the copy-of-the-target initialisation, so agreement cannot be a coincidence."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))


def fake_sequence(length: int):
    class Cache:
        max_tokens = length + 16

    class Sequence:
        cache = Cache()
        num_tokens = length  # the prompt: the drafter observes it eagerly
        draft_limit = None  # adaptive speculation's: the drafter drafts all it would

    return Sequence()


def test_mtp_training_chain_equals_the_drafters_own_proposals():
    model = served()
    trainer = MtpTrainer(model)
    prompt = random_sequences(1, 12)[0]
    trainer.setup({"train": capture(model, [prompt + [5, 6, 7, 8]])})
    perturbed(trainer.model)
    drafter = trainer.drafter()
    assert isinstance(drafter, MtpDrafter)
    # Inference: commit the prompt with root x = prompt's next token, then draft a chain of 3.
    root = 9
    first = capture(model, [prompt])[0]
    sequence = fake_sequence(len(prompt))
    state = drafter.start(sequence)
    drafter.observe(state, TargetStates(prompt, 0, {}, first.final_hidden.float(), root))
    proposal = drafter.propose(state, sequence).tokens
    # Training: the same chain, on the sequence the drafts describe (prompt, root, drafts).
    sequence = capture(model, [prompt + [root] + proposal])[0]
    rotary = RotaryEmbedding(model.loaded.decoder.config, torch.float32)
    with torch.no_grad():
        chain = chain_hidden(trainer.model, model, rotary, sequence, 3)
    t = len(prompt) - 1  # the chain starting at the last prompt position
    vocabulary = drafter.vocabulary
    trained = [int(vocabulary.to_target(vocabulary.logits(chain[step][t]).argmax())) for step in range(3)]
    assert trained == proposal


def test_dflash_training_blocks_equal_the_drafters_block_logits():
    model = served()
    trainer = DFlashTrainer(model)
    trainer.config.target_layer_ids = trainer.target_layers = (0, 2)
    trainer.config.num_layers = 1
    sequence_ids = random_sequences(1, 40)[0]
    trainer.setup({"train": capture(model, [sequence_ids], trainer.target_layers)})
    perturbed(trainer.model)
    sequence = capture(model, [sequence_ids], trainer.target_layers)[0]
    rotary = RotaryEmbedding(model.loaded.decoder.config, torch.float32)
    anchors = torch.tensor([5, 17, 30])
    with torch.no_grad():
        trained = block_hidden(
            trainer.model, model, rotary, sequence, anchors, trainer.config.block_size, trainer.mask_token_id
        )
    drafter = trainer.drafter()
    assert isinstance(drafter, DFlashDrafter)
    hidden = model.loaded.config.hidden_size
    for row, anchor in enumerate(anchors.tolist()):
        state = drafter.start(fake_sequence(len(sequence_ids)))
        layers = {
            layer: sequence.layer_hidden[:anchor, i * hidden : (i + 1) * hidden].float()
            for i, layer in enumerate(trainer.target_layers)
        }
        drafter.observe(state, TargetStates(sequence_ids[:anchor], 0, layers, None, sequence_ids[anchor]))
        inferred = drafter.block_logits(state, sequence_ids[anchor])
        torch.testing.assert_close(drafter.vocabulary.logits(trained[row]), inferred, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["mtp", "dflash"])
def test_a_few_updates_lower_the_loss_and_the_export_loads(kind, tmp_path):
    model = served()
    trainer = MtpTrainer(model) if kind == "mtp" else DFlashTrainer(model)
    if kind == "dflash":
        trainer.config.target_layer_ids = trainer.target_layers = (1, 3)
        trainer.config.num_layers = 1
    trainer.setup({"train": capture(model, random_sequences(4, 48, seed=3) * 2, trainer.target_layers)})
    trainer.config.sequences_per_update = 4
    trainer.config.lr = 3e-3
    losses = trainer.train(0, 30, 30, Progress())
    # The soft cross-entropy is floored at the target's entropy (high for a random tiny model), so a
    # working trainer moves it by several percent here, a broken one (no gradient) by nothing.
    assert sum(losses[-5:]) / 5 < 0.95 * sum(losses[:5]) / 5, losses
    folder = tmp_path / kind
    trainer.export(folder)
    assert {p.name for p in folder.iterdir()} == {"config.json", "model.safetensors", "draft_vocab.json"}
    mode = "mtp" if kind == "mtp" else "tree"
    drafter = load_drafter(mode, model.loaded, DraftOptions(draft=folder))
    assert torch.equal(drafter.vocabulary.token_ids, trainer.vocab)
