"""Step costs kept on disk between starts (worker/serving/step_cost_cache.py): the second start
reads what the first measured; a change in anything the costs depend on (threads, formats, the
model file, the drafter's checkpoint, the CPU) measures again; a damaged file is a miss, not a
failure. The key of a real served model changes with its thread count, its file and its head's."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from tests.support.tiny_drafters import write_random_mtp
from tests.support.tiny_models import make_tiny_model
from worker.drafters.registry import DraftOptions
from worker.serving.step_cost_cache import StepCostKey, cache_path, cached_or_measured, cpu_model
from worker.serving.step_cost_probe import step_cost_key
from worker.serving_model import load_serving_model
from worker.speculation.step_costs import StepCosts

KEY = StepCostKey("m /models/m.gguf 100 B 1", "LinearFormats(int4)", "mtp mtp max_draft=3", 2, "EPYC", (1, 4))
COSTS = StepCosts({(1, 0): 0.015, (1, 3): 0.03, (4, 0): 0.04, (4, 3): 0.09})


class Probe:
    def __init__(self, costs: StepCosts | None = COSTS):
        self.costs, self.calls = costs, 0

    def __call__(self) -> StepCosts | None:
        self.calls += 1
        return self.costs


def test_the_second_start_reads_what_the_first_measured(tmp_path: Path) -> None:
    first, second = Probe(), Probe(StepCosts({(1, 0): 9.0}))
    assert cached_or_measured(tmp_path, KEY, first) == COSTS and first.calls == 1
    assert cached_or_measured(tmp_path, KEY, second) == COSTS and second.calls == 0
    assert cache_path(tmp_path, KEY).exists()


@pytest.mark.parametrize(
    "change", [{"threads": 1}, {"formats": "LinearFormats(int8)"}, {"model": "m other"}, {"cpu": "Xeon"}]
)
def test_a_changed_key_measures_again(tmp_path: Path, change: dict) -> None:
    cached_or_measured(tmp_path, KEY, Probe())
    other, probe = dataclasses.replace(KEY, **change), Probe(StepCosts({(1, 0): 0.5}))
    assert cached_or_measured(tmp_path, other, probe) == StepCosts({(1, 0): 0.5}) and probe.calls == 1
    assert cached_or_measured(tmp_path, KEY, Probe()) == COSTS, "each key keeps its own table"


def test_a_damaged_or_foreign_file_is_a_miss(tmp_path: Path) -> None:
    cache_path(tmp_path, KEY).write_text("{not json")
    probe = Probe()
    assert cached_or_measured(tmp_path, KEY, probe) == COSTS and probe.calls == 1
    other = dataclasses.replace(KEY, threads=7)
    cache_path(tmp_path, other).write_text(cache_path(tmp_path, KEY).read_text())  # a digest clash, in effect
    probe = Probe()
    assert cached_or_measured(tmp_path, other, probe) == COSTS and probe.calls == 1


def test_a_table_the_time_budget_cut_short_serves_one_start_only(tmp_path: Path) -> None:
    partial = StepCosts({(1, 0): 0.02, (1, 3): 0.05}, complete=False)
    first, second = Probe(partial), Probe()
    assert cached_or_measured(tmp_path, KEY, first) == partial
    assert cached_or_measured(tmp_path, KEY, second) == COSTS and second.calls == 1, "measured again"
    assert cached_or_measured(tmp_path, KEY, Probe(partial)) == COSTS, "the full table is kept"


def test_without_a_folder_every_start_measures_and_nothing_is_kept(tmp_path: Path) -> None:
    probe = Probe()
    cached_or_measured(None, KEY, probe)
    cached_or_measured(None, KEY, probe)
    assert probe.calls == 2 and not list(tmp_path.iterdir())


def test_the_cpu_model_is_read_from_cpuinfo(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n")
    assert cpu_model(tmp_path / "cpuinfo") == "AMD EPYC 7B13"
    assert cpu_model(tmp_path / "missing") == "unknown"


def test_a_served_models_key_follows_its_threads_and_its_file(tmp_path: Path) -> None:
    folder = make_tiny_model(tmp_path / "qwen3", "qwen3")
    served = load_serving_model(folder, "ngram")
    threads = torch.get_num_threads()
    key = step_cost_key(served, 3, (1, 4))
    assert key == step_cost_key(served, 3, (1, 4)) and key.threads == threads
    assert "ngram" in key.drafter and "max_draft=3" in key.drafter
    try:
        torch.set_num_threads(threads + 1)
        assert step_cost_key(served, 3, (1, 4)) != key
    finally:
        torch.set_num_threads(threads)
    weights = next(folder.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b"\0")  # another file at the same path
    assert step_cost_key(served, 3, (1, 4)).model != key.model


@pytest.mark.parametrize("mode", ["mtp", "auto"])
def test_the_key_follows_the_drafters_checkpoint(tmp_path: Path, mode: str) -> None:
    """Another head in the same place (a new bundled head, a retrained --draft) drafts at another
    cost: its table is measured again, not read from the old head's."""
    folder = make_tiny_model(tmp_path / "qwen3", "qwen3")
    head = write_random_mtp(tmp_path / "head", folder)
    key = step_cost_key(load_serving_model(folder, mode, DraftOptions(draft=head)), 3, (1, 4))
    assert str(head.resolve()) in key.drafter
    write_random_mtp(head, folder, seed=2, mtp_hidden="pre_norm")  # another size, whatever the clock's resolution
    assert step_cost_key(load_serving_model(folder, mode, DraftOptions(draft=head)), 3, (1, 4)) != key
