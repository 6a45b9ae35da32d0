"""A child process that serves one long prompt and reports its memory: run by the long-context tests.

    python -m tests.support.long_prompt_probe MODEL_DIR NUM_TOKENS SEED OUT.json

Loads MODEL_DIR in float64, warms up on a short prompt (so the baseline holds torch's own
buffers and one prefill chunk's), then runs the long prompt through `generate` (the runner's
chunked prefill, PREFILL_CHUNK rows a forward) for one greedy token. OUT.json gets the logits
that chose it (the last prompt token's), the peak RSS before and after, and the lane's cache bytes.
A child process so that its peak RSS is this run's alone.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

import torch

from shared.sampling import SamplingParams
from worker.engine.generate import generate
from worker.serving_model import load_serving_model

WARM_UP_TOKENS = 600  # past one prefill chunk


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def long_prompt(vocab_size: int, num_tokens: int, seed: int) -> list[int]:
    return torch.randint(0, vocab_size, (num_tokens,), generator=torch.Generator().manual_seed(seed)).tolist()


def main(folder: str, num_tokens: int, seed: int, out: str) -> None:
    torch.set_num_threads(1)
    served = load_serving_model(Path(folder), "none", dtype="float64", max_context=num_tokens + 1)
    runner = served.runner
    captured: list[torch.Tensor] = []
    runner.logits_observer = lambda sequence, logits, emitted: captured.append(logits[0].clone())
    prompt = long_prompt(runner.vocab_size, num_tokens, seed)
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    generate(runner, served.tokenizer, prompt[:WARM_UP_TOKENS], one)
    baseline = peak_rss_bytes()
    generate(runner, served.tokenizer, prompt, one)
    report = {
        "logits": captured[-1].tolist(),
        "baseline_rss": baseline,
        "peak_rss": peak_rss_bytes(),
        "cache_bytes": runner.decoder.cache_bytes(num_tokens + 1 + runner.max_draft_nodes + 1),
    }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
