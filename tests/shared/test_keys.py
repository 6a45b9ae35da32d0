"""Every Redis name is prefixed and distinct per request, worker and model."""

from __future__ import annotations

from shared import keys

PER_REQUEST = [keys.events_channel, keys.event_log, keys.job_state, keys.cancel_key]


def test_every_name_has_the_arbor_prefix() -> None:
    names = [f("chatcmpl-1") for f in PER_REQUEST]
    names += [keys.request_stream("m"), keys.worker_heartbeat("w"), keys.CONTROL_CHANNEL]
    names += [keys.WORKERS_SET, keys.DEAD_LETTER_STREAM]

    assert all(name.startswith("arbor:") for name in names)
    assert len(set(names)) == len(names)


def test_per_request_names_embed_the_request_id() -> None:
    assert [f("cmpl-9") for f in PER_REQUEST] == [
        "arbor:events:cmpl-9",
        "arbor:eventlog:cmpl-9",
        "arbor:job:cmpl-9",
        "arbor:cancel:cmpl-9",
    ]


def test_model_and_worker_names() -> None:
    assert keys.request_stream("Qwen/Qwen3-0.6B") == "arbor:requests:Qwen/Qwen3-0.6B"
    assert keys.worker_heartbeat("host-1-ab") == "arbor:worker:host-1-ab"
    assert keys.CONSUMER_GROUP == "workers"
