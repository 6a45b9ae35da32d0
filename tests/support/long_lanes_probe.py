"""A child process that serves several long prompts at once through the scheduler and reports its
memory: run by the full-context test.

    python -m tests.support.long_lanes_probe MODEL_DIR NUM_LANES NUM_TOKENS MAX_TOKENS DTYPE OUT.json

Loads MODEL_DIR in DTYPE at the model's own maximum context, builds the worker's stepper (a KV
pool sized for the lanes when the model's lanes take one) and scheduler, warms them up on one
short prompt (so the baseline holds torch's own buffers and a prefill chunk's), then submits
NUM_LANES prompts of NUM_TOKENS tokens (long_prompt, seeds 0..) together, MAX_TOKENS greedy
tokens each with the top logprobs asked. The scheduler prefills them a 512-row step at a time in
arrival order while the lanes already prefilled decode, so with MAX_TOKENS past the others'
prefill steps every lane is alive at once. OUT.json gets each lane's first token and its top
logprobs, the peak RSS before and after, and the bytes the lanes' caches were computed to need.
A child process so that its peak RSS is this run's alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from shared.sampling import SamplingParams
from tests.support.long_prompt_probe import long_prompt, peak_rss_bytes
from worker.models.pool_factory import new_pool
from worker.serving.model_stepper import LaneStart, ModelStepper
from worker.serving.scheduler import LaneRequest, Scheduler, SchedulerConfig, StepKind
from worker.serving_model import load_serving_model

WARM_UP_TOKENS = 600  # past one prefill chunk
MAX_BATCH_TOKENS = 512  # the rows of one step: the worker's default prefill chunk
NUM_LOGPROBS = 20


def serve_together(stepper: ModelStepper, prompts: list[list[int]], max_lanes: int, max_tokens: int) -> list[dict]:
    """Every prompt submitted at once; each lane's first token and top logprobs, in prompt order."""
    scheduler = Scheduler(stepper, SchedulerConfig(max_lanes, 1 << 50, MAX_BATCH_TOKENS, stepper.num_blocks))
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for index, prompt in enumerate(prompts):
        start = LaneStart(f"lane-{index}", prompt, params, num_logprobs=NUM_LOGPROBS)
        request = LaneRequest(
            (f"lane-{index}", 0),
            stepper.kv_bytes(len(prompt), max_tokens),
            None,
            start,
            stepper.blocks_to_admit(len(prompt)),
            stepper.max_blocks(len(prompt), max_tokens),
        )
        scheduler.submit(request)
    first: dict[int, dict] = {}
    while not scheduler.idle:
        for result in scheduler.step():
            assert result.kind is not StepKind.FAILED, result.error
            if result.kind is not StepKind.DECODE:
                continue
            index = int(result.key[0].removeprefix("lane-"))
            if index not in first:  # the prompt's last token chose it: the long positions' logits
                chosen = result.state.logprobs[0]
                first[index] = {"token_id": chosen.token_id, "top": chosen.top}
            if result.state.finished:
                scheduler.retire(result.key)
    return [first[index] for index in range(len(prompts))]


def main(folder: str, num_lanes: int, num_tokens: int, max_tokens: int, dtype: str, out: str) -> None:
    torch.set_num_threads(1)
    served = load_serving_model(Path(folder), "none", dtype=dtype)
    runner = served.runner
    lane_bytes = runner.decoder.cache_bytes(num_tokens + max_tokens + runner.max_draft_nodes + 1)
    stepper = ModelStepper(runner, None, None, new_pool(runner.decoder, num_lanes * lane_bytes, num_lanes))
    prompts = [long_prompt(runner.vocab_size, num_tokens, seed) for seed in range(num_lanes)]
    serve_together(stepper, [prompts[0][:WARM_UP_TOKENS]], num_lanes, 2)
    baseline = peak_rss_bytes()
    lanes = serve_together(stepper, prompts, num_lanes, max_tokens)
    report = {
        "lanes": lanes,
        "baseline_rss": baseline,
        "peak_rss": peak_rss_bytes(),
        "cache_bytes": num_lanes * lane_bytes,
        "max_context": runner.max_context,
    }
    Path(out).write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
