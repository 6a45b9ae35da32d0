"""The evaluation's task files: deterministic, answers right, and YAMLs lm-eval loads offline."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from ops.eval.tasks import ARITHMETIC_TASK, MC_TASK, PPL_TASK, TASKS, arithmetic_items, stdlib_docstrings, write_tasks


def test_the_same_seed_writes_the_same_files(tmp_path: Path) -> None:
    first, second = write_tasks(tmp_path / "a", 8), write_tasks(tmp_path / "b", 8)
    for task in TASKS:
        assert (first.folder / f"{task}.jsonl").read_text() == (second.folder / f"{task}.jsonl").read_text()
    assert first.num_items == {task: 8 for task in TASKS}


def test_arithmetic_answers_are_right() -> None:
    for item in arithmetic_items(40, seed=3):
        question = item["question"].split("Question: ")[-1]
        a, b = map(int, re.findall(r"\d+", question)[:2])
        expected = a + b if "buys" in question and "boxes" not in question else a - b if "away" in question else a * b
        assert item["answer"] == str(expected) and expected >= 0 and item["question"].endswith("Answer:")


def test_each_choice_question_has_its_module_at_gold(tmp_path: Path) -> None:
    docs = dict(stdlib_docstrings())
    assert len(docs) >= 50 and "json" in docs and "this" not in docs
    files = write_tasks(tmp_path, 10)
    for line in (files.folder / f"{MC_TASK}.jsonl").read_text().splitlines():
        item = json.loads(line)
        module = item["choices"][item["gold"]]
        summary = " ".join(docs[module].split("\n\n")[0].split())
        assert summary in item["question"] and len(set(item["choices"])) == 4


def test_the_yamls_read_the_local_jsonl(tmp_path: Path) -> None:
    files = write_tasks(tmp_path, 3)
    for task, kind in (
        (PPL_TASK, "loglikelihood_rolling"),
        (MC_TASK, "multiple_choice"),
        (ARITHMETIC_TASK, "generate_until"),
    ):
        config = yaml.safe_load((files.folder / f"{task}.yaml").read_text())
        assert (config["task"], config["output_type"], config["dataset_path"]) == (task, kind, "json")
        assert Path(config["dataset_kwargs"]["data_files"]["test"]) == (files.folder / f"{task}.jsonl").resolve()
