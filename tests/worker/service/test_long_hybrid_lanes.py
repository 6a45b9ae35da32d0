"""(slow) Four concurrent long prompts on a tiny hybrid with max_position_embeddings 262,144,
through a real worker's scheduler (prefill chunks of up to 512 rows beside the others' decoding):
each stream is what `generate` gives the same prompt alone, in float64 so batching cannot
change a greedy choice. The worker's context is the model's own maximum (no ARBOR_MAX_CONTEXT)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.openai_schema import CompletionRequest, to_sampling_params
from tests.support.long_prompt_probe import long_prompt
from tests.support.tiny_hybrid_models import make_tiny_hybrid_model
from tests.worker.service.harness import (
    InProcessWorker,
    completion_body,
    service_config,
    submit,
    token_ids_of,
    wait_done,
)
from worker.engine.generate import generate
from worker.serving_model import load_serving_model

MAX_POSITIONS = 262144
PROMPT_TOKENS = 8192
NUM_LANES = 4


@pytest.mark.slow
def test_four_long_lanes_at_once_each_equal_generate_alone(tmp_path: Path, redis_server, client):
    folder = make_tiny_hybrid_model(tmp_path / "long-next", "qwen3_next", max_position_embeddings=MAX_POSITIONS)
    served = load_serving_model(folder, "none", dtype="float64")
    prompts = [long_prompt(served.runner.vocab_size, PROMPT_TOKENS, seed) for seed in range(NUM_LANES)]
    bodies = [completion_body(prompt, max_tokens=8) for prompt in prompts]
    config = service_config(redis_server.url, max_context=None, max_lanes=NUM_LANES, max_batch_tokens=512)
    with InProcessWorker(config, served):
        # a deadline for a loaded 2-core machine: four lanes of long prefill take minutes there
        request_ids = [submit(client, body, kind="completion", deadline_s=1800) for body in bodies]
        streams = [token_ids_of(wait_done(client, request_id, timeout_s=1800)) for request_id in request_ids]
    assert served.runner.max_context == MAX_POSITIONS  # the model's own: the default cache holds it
    for prompt, body, stream in zip(prompts, bodies, streams, strict=True):
        params = to_sampling_params(CompletionRequest.model_validate(body))
        assert stream == generate(served.runner, served.tokenizer, prompt, params).token_ids
