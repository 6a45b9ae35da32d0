"""(slow) Four full-length contexts at once on a tiny hybrid whose max_position_embeddings is
Qwen3-Next's 262,144 (YaRN-scaled partial RoPE, gated attention, MoE).

Four prompts of PROMPT_TOKENS tokens each are submitted together to the worker's scheduler and
stepper (the objects a worker builds), in float32, in a child process that measures its own peak
RSS. The scheduler prefills them 512 rows a step, in arrival order, while the lanes already
prefilled decode; each asks for MAX_TOKENS tokens, more than the other lanes' prefill steps, so
all four are alive at once, each with a context past 260,000 tokens: prompt + MAX_TOKENS + the
lane's scratch row is the model's maximum. Then:

- memory: the peak grows by at most the four lanes' computed cache bytes + one step's boolean
  masks (the causal mask's committed-prefix part and the concatenated mask: 2 x 512 rows x context
  bytes) + one attention block's buffer (MAX_SCORE_BYTES) + 256 MB. One [heads, 512, 262,144]
  float32 score buffer alone is 512 MB a head; the lanes' K/V is ~130 MB.
- correctness at the longest positions: the last lane's logprobs of its first greedy token equal
  those of a float64 reference by another path: the same decoder fed 64 rows a forward
  (MAX_VERIFY_TOKENS; the recurrent delta rule token by token instead of the chunked form), one
  lane alone, no scheduler. Float32 against float64 over 260K positions: within LOGPROB_ATOL
  (4,096 and 32,768 tokens: ~5e-5), while a position, RoPE or state carried wrongly moves
  logprobs by tenths.

Cost (one torch thread, this 2-core machine shared at a load of ~2): 29 minutes, the four lanes
~19 and the float64 reference ~10; the peak RSS grew by 353 MB against a bound of 720 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.support.long_lanes_probe import MAX_BATCH_TOKENS
from tests.support.long_prompt_probe import long_prompt
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.worker.models.hybrid.test_hybrid_long_context import YARN, recurrent_reference
from worker.models.attention import MAX_SCORE_BYTES

MAX_POSITIONS = 262144
NUM_LANES = 4
MAX_TOKENS = 2048  # decode steps outlasting the 3 x 512 steps the later lanes' prefill takes
PROMPT_TOKENS = MAX_POSITIONS - MAX_TOKENS - 1  # 260,095: + the output + one scratch row
LOGPROB_ATOL = 1e-3
SLACK_BYTES = 256 << 20
# One attention head: the quadratic part of 4 x 262K prefills is the test's time, and it scales
# with the heads (a 512-row chunk over 262,144 keys, one core: 0.67 s float32 with one head, 0.97
# with two over one kv head). Grouped heads are tested at short lengths; long ones add nothing.
SHAPE = dict(num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=MAX_POSITIONS, rope_parameters=YARN)
REPO_ROOT = Path(__file__).resolve().parents[4]


def serve_in_child(folder: Path, out: Path, num_tokens: int) -> dict:
    command = [sys.executable, "-m", "tests.support.long_lanes_probe", str(folder), str(NUM_LANES), str(num_tokens)]
    subprocess.run([*command, str(MAX_TOKENS), "float32", str(out)], cwd=REPO_ROOT, check=True, timeout=3600)
    return json.loads(out.read_text())


def check_lane(served: dict, reference_logits: torch.Tensor) -> None:
    expected = torch.log_softmax(reference_logits, dim=-1)
    assert served["token_id"] == int(reference_logits.argmax())
    for token_id, logprob in served["top"]:
        assert abs(logprob - float(expected[token_id])) <= LOGPROB_ATOL, (token_id, logprob, float(expected[token_id]))


def memory_bound(report: dict, context: int) -> int:
    masks = 2 * MAX_BATCH_TOKENS * context  # bool: the prefix part, and the mask it is concatenated into
    return report["cache_bytes"] + masks + MAX_SCORE_BYTES + SLACK_BYTES


@pytest.mark.slow
def test_four_full_contexts_at_once_in_bounded_memory_match_a_float64_reference(tmp_path):
    folder = make_tiny_hybrid_model(tmp_path / "tiny-full", "qwen3_next", **SHAPE)
    report = serve_in_child(folder, tmp_path / "probe.json", PROMPT_TOKENS)
    assert report["max_context"] == MAX_POSITIONS  # the model's own: nothing capped the lanes
    grown = report["peak_rss"] - report["baseline_rss"]
    bound = memory_bound(report, PROMPT_TOKENS)
    assert grown <= bound, f"peak RSS grew {grown:,} B serving {NUM_LANES} x {PROMPT_TOKENS}; bound {bound:,} B"

    last = NUM_LANES - 1  # its rows came last in every shared step
    vocab_size = json.loads((folder / "config.json").read_text())["vocab_size"]
    with torch.inference_mode():
        expected = recurrent_reference(folder, long_prompt(vocab_size, PROMPT_TOKENS, last))
    check_lane(report["lanes"][last], expected)
