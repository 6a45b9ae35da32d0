"""lm-eval (`arbor eval`) end to end against a live one-model stack, offline, a few items per task;
its scores equal the ones computed here in process with transformers' float32 forward of the same
tokens (loglikelihoods within 1e-3 per sequence, so choices and perplexities agree) and greedy
generation.

Its own stack: lm-eval's remote tokenizer names no model, so the stack serves exactly one.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tokenizers
import torch
import transformers

from ops.eval.run import EvalRun, run_eval
from ops.eval.tasks import ARITHMETIC_TASK, MC_TASK, PPL_TASK
from tests.e2e.live_stack import READY_LINE, START_TIMEOUT_S, TINY_MODEL, free_loopback_port, spawn, stop
from tests.support.redis_server import RedisServer
from tests.support.tiny_models import make_tiny_model
from tests.support.waiting import wait_for

NUM_ITEMS = 4
ATOL = 1e-3
CONTEXT = 2048


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("eval-model") / TINY_MODEL, max_position_embeddings=CONTEXT)


@pytest.fixture(scope="module")
def base_url(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log_dir = tmp_path_factory.mktemp("eval-logs")
    port = free_loopback_port()
    with RedisServer() as redis_server:
        env = dict(os.environ, REDIS_URL=redis_server.url, OMP_NUM_THREADS="1", ARBOR_LOG_LEVEL="warning")
        env.pop("ARBOR_API_KEYS", None)
        argv = ["up", "--model", str(tiny), "--speculation", "ngram", "--port", str(port), "--workers", "1"]
        processes = {"up": spawn(argv, env, log_dir / "up.log")}
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for(lambda: _serving(url, log_dir / "up.log", processes["up"]), START_TIMEOUT_S, "the stack", 0.5)
            yield url
        finally:
            statuses = stop(processes)
        assert statuses == {"up": 0}, (log_dir / "up.log").read_text()[-3000:]


def _serving(url: str, log: Path, process) -> bool:
    assert process.poll() is None, log.read_text()[-3000:]
    if READY_LINE not in log.read_text():
        return False
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def evaluated(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> EvalRun:
    return run_eval(base_url, tmp_path_factory.mktemp("eval-out"), num_items=NUM_ITEMS, num_concurrent=2)


class Oracle:
    """The tiny model in process: transformers, float32."""

    def __init__(self, folder: Path) -> None:
        self.model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.tokenizer = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.eos_id = self.tokenizer.token_to_id("<|im_end|>")

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def loglikelihood(self, context_ids: list[int], continuation_ids: list[int]) -> float:
        ids = context_ids + continuation_ids
        with torch.inference_mode():
            logprobs = torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)
        start = len(context_ids)
        return sum(logprobs[start + i - 1, token].item() for i, token in enumerate(continuation_ids))

    def pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """lm-eval's split: trailing spaces go to the continuation; the whole is encoded, then cut."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, context_ids = self.encode(context + continuation), self.encode(context)
        return context_ids, whole[len(context_ids) :]

    def greedy(self, prompt: str, max_new_tokens: int, stops: list[str]) -> str:
        ids = self.encode(prompt)
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.eos_id
            )
        text = self.tokenizer.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
        for stop_string in stops:
            text = text.split(stop_string)[0]
        return text


@pytest.fixture(scope="module")
def oracle(tiny: Path) -> Oracle:
    return Oracle(tiny)


def test_every_task_ran_on_every_item_and_the_table_names_them(evaluated: EvalRun) -> None:
    for task in (PPL_TASK, MC_TASK, ARITHMETIC_TASK):
        assert len(evaluated.samples[task]) == NUM_ITEMS, task
        assert task in evaluated.table
    assert (evaluated.results_path.parent.parent.parent / "table.md").read_text() == evaluated.table


def test_multiple_choice_scores_equal_the_in_process_ones(evaluated: EvalRun, oracle: Oracle) -> None:
    correct = correct_norm = 0
    for sample in evaluated.samples[MC_TASK]:
        served = [float(resp[0][0]) for resp in sample["resps"]]
        here = [oracle.loglikelihood(*oracle.pair(*arguments)) for arguments in _arguments(sample)]
        assert served == pytest.approx(here, abs=ATOL)
        choices, gold = sample["doc"]["choices"], sample["doc"]["gold"]
        correct += int(max(range(len(here)), key=here.__getitem__) == gold)
        normed = [ll / len(choice) for ll, choice in zip(here, choices, strict=True)]  # lm-eval: chars, no delimiter
        correct_norm += int(max(range(len(normed)), key=normed.__getitem__) == gold)
    results = evaluated.results[MC_TASK]
    assert results["acc,none"] == pytest.approx(correct / NUM_ITEMS)
    assert results["acc_norm,none"] == pytest.approx(correct_norm / NUM_ITEMS)


def test_perplexity_equals_the_in_process_one(evaluated: EvalRun, oracle: Oracle) -> None:
    total_ll, total_words = 0.0, 0
    for sample in evaluated.samples[PPL_TASK]:
        text = sample["doc"]["text"]
        ids = oracle.encode(text)
        assert len(ids) < CONTEXT - 1  # one window: the whole text after the prefix token
        ll = oracle.loglikelihood([oracle.eos_id], ids)
        assert float(sample["resps"][0][0]) == pytest.approx(ll, abs=ATOL * 10)
        total_ll, total_words = total_ll + ll, total_words + len(re.split(r"\s+", text))
    word_perplexity = evaluated.results[PPL_TASK]["word_perplexity,none"]
    assert word_perplexity == pytest.approx(math.exp(-total_ll / total_words), rel=1e-4)


def test_generations_and_exact_match_equal_the_in_process_ones(evaluated: EvalRun, oracle: Oracle) -> None:
    matches = 0
    for sample in evaluated.samples[ARITHMETIC_TASK]:
        context, kwargs = _arguments(sample)[0]
        here = oracle.greedy(context, kwargs["max_gen_toks"], kwargs["until"])
        assert sample["resps"][0][0] == here
        number = re.search(r"(-?[0-9]+)", here)
        matches += int(number is not None and number.group(0) == sample["doc"]["answer"])
    assert evaluated.results[ARITHMETIC_TASK]["exact_match,first_number"] == pytest.approx(matches / NUM_ITEMS)


def _arguments(sample: dict) -> list:
    arguments = sample["arguments"]
    if isinstance(arguments, dict):  # lm-eval logs {"gen_args_0": {"arg_0": ..., "arg_1": ...}, ...}
        return [[value for _, value in sorted(entry.items())] for _, entry in sorted(arguments.items())]
    return arguments
