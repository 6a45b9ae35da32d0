"""Priority classes on a real worker: every lane busy with priority-10 jobs, a priority-0 job
arrives, preempts one of them, and finishes while they still run; every output is exactly what
in-process generation makes (the preempted job's tokens continue: nothing lost or repeated)."""

from __future__ import annotations

import json
import time
import uuid

from shared import keys
from shared.protocol import FinalEvent, Job
from tests.worker.service.harness import (
    MODEL,
    InProcessWorker,
    chat_body,
    events_of,
    service_config,
    token_ids_of,
    wait_done,
    wait_for,
)
from tests.worker.service.test_service import reference

LONG_TOKENS = 120


def submit_with_priority(client, body: dict, priority: int) -> str:
    """XADD to the class's stream as the gateway does (class listed, group made first)."""
    stream = keys.request_stream(MODEL, priority)
    if not client.exists(stream):
        client.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
    client.zadd(keys.priority_classes(MODEL), {str(priority): priority})
    now = time.time()
    job = Job(
        id=f"chatcmpl-{uuid.uuid4().hex}",
        model=MODEL,
        kind="chat",
        body=json.dumps(body),
        created=now,
        deadline=now + 120,
        priority=priority,
    )
    client.xadd(stream, job.to_fields())
    return job.id


def finished(client, request_id: str) -> bool:
    return any(isinstance(event, FinalEvent) for event in events_of(client, request_id))


def test_a_better_class_preempts_a_full_worker_and_nothing_is_lost(redis_server, client, served_none):
    batch = [
        chat_body(f"Write a long story about fox number {i}", max_tokens=LONG_TOKENS, ignore_eos=True) for i in (1, 2)
    ]
    urgent = chat_body("Hello there", max_tokens=8)
    client.zadd(keys.priority_classes(MODEL), {"10": 10})  # known to the worker from its first read
    config = service_config(redis_server.url, max_lanes=2)
    with InProcessWorker(config, served_none) as worker:
        batch_ids = [submit_with_priority(client, body, 10) for body in batch]
        for request_id in batch_ids:
            wait_for(lambda rid=request_id: len(events_of(client, rid)) >= 3, 30, "the batch jobs to decode")
        urgent_id = submit_with_priority(client, urgent, 0)
        urgent_events = wait_done(client, urgent_id)
        assert not any(finished(client, rid) for rid in batch_ids), "it ran before a batch job ended"
        batch_events = [wait_done(client, rid) for rid in batch_ids]
        assert worker.service.capacity.preemptions_by_class == {10: 1}

    assert token_ids_of(urgent_events) == reference(served_none, urgent)[1].token_ids
    for body, events in zip(batch, batch_events, strict=True):
        assert token_ids_of(events) == reference(served_none, body)[1].token_ids
        assert events[-1].usage.completion_tokens == LONG_TOKENS
