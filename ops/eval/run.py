"""`arbor eval`: lm-eval's `local-completions` against a running stack, offline, on the task files
of `ops.eval.tasks`; lm-eval's JSON (and its samples) and a short table in the results folder.

lm-eval reads the tokenizer from the server (`tokenizer_backend=remote`: /tokenizer_info,
/tokenize, /detokenize; it sends no model name, so the stack must serve one model) and sends
token ids (`tokenized_requests=True`), so the context/continuation split it scores is exactly the
tokens the server scores. Loglikelihoods come from `echo` + `logprobs` with `max_tokens: 1`.
Nothing is downloaded: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set, the `json` dataset builder
reads the local files, and the datasets cache lives in the results folder. With an API key, lm-eval
gets it as OPENAI_API_KEY (completions) and in its model_args (its tokenizer calls: the key is in
its command line while it runs), and the key is scrubbed from what it wrote.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops.eval.tasks import TASKS, write_tasks

# What the table shows per task (lm-eval's result keys are "<metric>,<filter>").
HEADLINE = {
    "arbor_stdlib_ppl": ("word_perplexity,none", "bits_per_byte,none"),
    "arbor_stdlib_mc": ("acc,none", "acc_norm,none"),
    "arbor_arithmetic": ("exact_match,first_number",),
}
MAX_LENGTH = 2048  # lm-eval's window for rolling loglikelihoods, capped by the model's context


@dataclass(frozen=True, slots=True)
class EvalRun:
    results_path: Path  # lm-eval's results JSON
    results: dict[str, Any]  # its "results" section: task -> metrics
    samples: dict[str, list[dict[str, Any]]]  # task -> lm-eval's logged samples
    table: str
    wall_s: float


def run_eval(
    base_url: str,
    out: Path,
    model: str | None = None,
    num_items: int = 50,
    tasks: tuple[str, ...] = TASKS,
    api_key: str | None = None,
    num_concurrent: int = 4,
    timeout_s: float = 3600.0,
) -> EvalRun:
    if importlib.util.find_spec("lm_eval") is None:
        raise ValueError(
            "arbor eval runs lm-eval: install it with pip install 'lm-eval[api]==0.4.13' (in the dev extra)"
        )
    out.mkdir(parents=True, exist_ok=True)
    model, max_context = served_model(base_url, model, api_key)
    files = write_tasks(out / "tasks", num_items)
    started = time.monotonic()
    command = lm_eval_command(base_url, model, max_context, files.folder, tasks, out / "lm-eval", num_concurrent)
    if api_key:  # its tokenizer calls send this one (its completions send OPENAI_API_KEY's)
        command[command.index("--model_args") + 1] += f",auth_token={api_key}"
    log_path = out / "lm-eval.log"
    with log_path.open("wb") as log:
        completed = subprocess.run(
            command, env=_offline_env(out, api_key), stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    wall_s = time.monotonic() - started
    if api_key:
        _scrub(out / "lm-eval", api_key)
    if completed.returncode != 0:
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"lm-eval exited with {completed.returncode} (log {log_path}):\n{tail}")
    results_path = _newest(out / "lm-eval", "results_*.json")
    results = json.loads(results_path.read_text())["results"]
    samples = {task: _read_samples(results_path.parent, task) for task in tasks}
    table = format_table(results, tasks, model, wall_s)
    (out / "table.md").write_text(table)
    return EvalRun(results_path, results, samples, table, wall_s)


def lm_eval_command(
    base_url: str,
    model: str,
    max_context: int,
    include_path: Path,
    tasks: tuple[str, ...],
    output_path: Path,
    num_concurrent: int,
) -> list[str]:
    model_args = ",".join(
        [
            f"base_url={base_url.rstrip('/')}/v1/completions",
            f"model={model}",
            "tokenizer_backend=remote",
            "tokenized_requests=True",
            f"num_concurrent={num_concurrent}",
            "max_retries=1",
            f"max_length={min(MAX_LENGTH, max_context)}",
        ]
    )
    return [
        sys.executable,
        "-m",
        "lm_eval",
        "run",
        "--model",
        "local-completions",
        "--model_args",
        model_args,
        "--tasks",
        ",".join(tasks),
        "--include_path",
        str(include_path),
        "--output_path",
        str(output_path),
        "--log_samples",
        "--batch_size",
        "1",
    ]


def served_model(base_url: str, model: str | None, api_key: str | None) -> tuple[str, int]:
    """The model to evaluate (the only one served, unless named) and its context length."""
    request = urllib.request.Request(f"{base_url.rstrip('/')}/v1/models", headers=_auth(api_key))
    with urllib.request.urlopen(request, timeout=30) as response:
        cards = [card for card in json.loads(response.read())["data"] if card.get("root") in (None, card["id"])]
    if model is None:
        if len(cards) != 1:
            raise ValueError(f"--model: the stack serves {len(cards)} models; name one of {[c['id'] for c in cards]}")
        model = cards[0]["id"]
    card = next((card for card in cards if card["id"] == model), None)
    if card is None:
        raise ValueError(f"--model: {model!r} is not served at {base_url}")
    return model, int(card.get("max_model_len") or MAX_LENGTH)


def format_table(results: dict[str, Any], tasks: tuple[str, ...], model: str, wall_s: float) -> str:
    lines = [
        f"model {model}, Python {sys.version.split()[0]}, {wall_s:.1f} s",
        "",
        "| task | metric | value | stderr |",
        "|---|---|---|---|",
    ]
    for task in tasks:
        metrics = results.get(task, {})
        for key in HEADLINE.get(task, ()):
            value, stderr = metrics.get(key), metrics.get(key.replace(",", "_stderr,", 1))
            lines.append(f"| {task} | {key.split(',')[0]} | {_number(value)} | {_number(stderr)} |")
    return "\n".join(lines) + "\n"


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, int | float) else "-"


def _offline_env(out: Path, api_key: str | None) -> dict[str, str]:
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    env["HF_HOME"] = str((out / "hf-cache").resolve())  # the json builder's cache: ours, not the user's
    env["TOKENIZERS_PARALLELISM"] = "false"
    if api_key:
        env["OPENAI_API_KEY"] = api_key  # local-completions sends it as the bearer token
    return env


def _scrub(folder: Path, secret: str) -> None:
    """lm-eval writes its model_args, the key among them, into its results: the key goes."""
    for path in folder.rglob("*.json*"):
        text = path.read_text(errors="replace")
        if secret in text:
            path.write_text(text.replace(secret, "<redacted>"))


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _newest(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern), key=lambda path: path.stat().st_mtime)
    if not found:
        raise RuntimeError(f"lm-eval wrote no {pattern} under {folder}")
    return found[-1]


def _read_samples(folder: Path, task: str) -> list[dict[str, Any]]:
    paths = sorted(folder.glob(f"samples_{task}_*.jsonl"), key=lambda path: path.stat().st_mtime)
    if not paths:
        return []
    return [json.loads(line) for line in paths[-1].read_text().splitlines() if line.strip()]
