"""Where a job is prepared: on the worker's event loop when that is quick, in a thread otherwise."""

from __future__ import annotations

import json
import time

from shared.protocol import Job
from tests.support.tiny_models import make_tiny_model
from worker.redis_side.intake import INLINE_PREPARE_BYTES, prepare_off_loop
from worker.serving_model import load_serving_model


def job(body: dict) -> Job:
    return Job(
        id="chatcmpl-1",
        model="tiny",
        kind="chat",
        body=json.dumps(body),
        created=time.time(),
        deadline=time.time() + 60,
    )


def test_a_long_body_and_a_request_that_may_be_constrained_are_prepared_off_the_loop(tmp_path):
    served = load_serving_model(make_tiny_model(tmp_path / "tiny"), "none")
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}]}
    assert not prepare_off_loop(job(chat), served)
    assert prepare_off_loop(job(chat | {"messages": [{"role": "user", "content": "x" * INLINE_PREPARE_BYTES}]}), served)
    for constrained in (
        {"response_format": {"type": "json_object"}},
        {"guided_json": {"type": "object"}},
        {"structured_outputs": {"regex": "a+"}},
        {"tool_choice": "required"},
    ):
        assert prepare_off_loop(job(chat | constrained), served), constrained  # its grammar is compiled
