"""With `min_replicas`, a worker's event batch counts as written only once a replica confirms it
(`WAIT` on the publisher's connection): unconfirmed, it is sent again until one does, and the
job is not reported done meanwhile. A real master and replica (`ReplicatedPair`)."""

from __future__ import annotations

import time

from shared import keys
from shared.protocol import parse_event
from tests.support.sentinel_set import ReplicatedPair
from tests.worker.service.test_publishing import Recorder, delta, final_of, publisher, read_job_a
from worker.serving.handoff import JobDone


def pump_for(sink, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sink.pump(0.02)


def test_a_batch_no_replica_confirms_is_resent_until_one_does_and_lands_once() -> None:
    with ReplicatedPair() as pair, pair.master.client() as master:
        ref = read_job_a(master)
        pair.stop_replica()
        recorder = Recorder()
        sink = publisher(pair.url, recorder, min_replicas=1)
        for item in (delta(ref, 0, 7, first_output=True), final_of(ref, 1), JobDone(ref)):
            sink.put(item)
        pump_for(sink, 2.0)
        assert sink.busy and recorder.done == [], "not done while no replica confirms"
        assert [parse_event(raw).seq for raw in master.lrange(keys.event_log("a"), 0, -1)] == [0, 1], "on the master"
        pair.start_replica()
        deadline = time.monotonic() + 20
        while sink.busy and time.monotonic() < deadline:
            sink.pump(0.05)
        assert recorder.done == [ref] and recorder.lost == []
        with pair.replica.client() as replica:
            assert [parse_event(raw).seq for raw in replica.lrange(keys.event_log("a"), 0, -1)] == [0, 1], "once each"
            assert replica.xlen(keys.request_stream("tiny-model")) == master.xlen(keys.request_stream("tiny-model"))
        sink.close()


def test_without_min_replicas_the_master_alone_confirms_a_batch() -> None:
    with ReplicatedPair() as pair, pair.master.client() as master:
        ref = read_job_a(master)
        pair.stop_replica()
        recorder = Recorder()
        sink = publisher(pair.url, recorder)
        for item in (delta(ref, 0, 7, first_output=True), JobDone(ref)):
            sink.put(item)
        deadline = time.monotonic() + 10
        while sink.busy and time.monotonic() < deadline:
            sink.pump(0.05)
        assert recorder.done == [ref]
        sink.close()
