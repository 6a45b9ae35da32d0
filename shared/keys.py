"""Every Redis name Arbor uses, in one place. Format a key anywhere else and it will drift.

    arbor:requests:{model}      stream   jobs for one model at priority 0 (consumer group `workers`)
    arbor:requests:{model}:p{n} stream   the same for priority n (any other integer: one stream per class)
    arbor:classes:{model}       zset     priority -> score priority: the classes that have a stream
    arbor:offers:{model}:{worker} stream jobs offered to one worker first (prefix placement)
    arbor:offerstreams:{model}  set      every worker's offer stream of the model (reclaimers look in each)
    arbor:prefix:{model}:{hash} string   the worker that last served a request with this prefix, with a TTL
    arbor:placement:{model}     hash     placement decisions by outcome (routed, shared, moved): counters
    arbor:events:{request_id}   channel  a request's events, JSON (pub/sub: at-most-once)
    arbor:eventlog:{request_id} list     the same events, RPUSHed in seq order (repairs gaps)
    arbor:job:{request_id}      hash     the owning worker's progress (see `JobState`)
    arbor:cancel:{request_id}   string   set by the gateway when the client is gone
    arbor:control               channel  {"type": "cancel", "id": ...} to every worker
    arbor:worker:{worker_id}    hash     a worker's heartbeat (see `Heartbeat`), with a TTL
    arbor:workers               set      worker ids that have ever beaten (cleaned by reclaimers)
    arbor:deadletter            stream   jobs given up after too many deliveries
    arbor:restarts              hash     process name (`worker-1`, `gateway`) -> restarts by `arbor up`
    arbor:response:{response_id} string  a stored /v1/responses response and its input, JSON, with a TTL

What goes into each value is defined in `shared.protocol` and `shared.heartbeat`.
"""

from __future__ import annotations

PREFIX = "arbor:"

CONSUMER_GROUP = "workers"  # the one consumer group on every request stream
CONTROL_CHANNEL = f"{PREFIX}control"
WORKERS_SET = f"{PREFIX}workers"
DEAD_LETTER_STREAM = f"{PREFIX}deadletter"
PROCESS_RESTARTS = f"{PREFIX}restarts"


def request_stream(model: str, priority: int = 0) -> str:
    """The stream a model's workers read jobs of one priority class from (`XREADGROUP GROUP
    workers ...`); class 0, the default, keeps the plain name."""
    return f"{PREFIX}requests:{model}" if priority == 0 else f"{PREFIX}requests:{model}:p{priority}"


def priority_classes(model: str) -> str:
    """The sorted set of priority classes with a stream (member and score: the priority)."""
    return f"{PREFIX}classes:{model}"


def offer_stream(model: str, worker_id: str) -> str:
    """Jobs placed on one worker: it reads them before the shared streams; a job left unread for
    the offer wait goes to its class stream (`shared.placement`)."""
    return f"{PREFIX}offers:{model}:{worker_id}"


def offer_streams(model: str) -> str:
    """The set of the model's offer streams: a worker adds its own when it starts."""
    return f"{PREFIX}offerstreams:{model}"


def prefix_owner(model: str, prefix_hash: str) -> str:
    """Which worker last served a request whose conversation starts with this prefix."""
    return f"{PREFIX}prefix:{model}:{prefix_hash}"


def placement_counts(model: str) -> str:
    """Placement decisions by outcome, for `arbor top` and /metrics."""
    return f"{PREFIX}placement:{model}"


def events_channel(request_id: str) -> str:
    """The pub/sub channel a request's events are published on."""
    return f"{PREFIX}events:{request_id}"


def event_log(request_id: str) -> str:
    """The list holding every event of a request, index == seq, so lost messages can be re-read."""
    return f"{PREFIX}eventlog:{request_id}"


def job_state(request_id: str) -> str:
    """The hash where the owning worker records its attempt, emitted tokens and next seq."""
    return f"{PREFIX}job:{request_id}"


def enqueued_marker(request_id: str) -> str:
    """The entry id the request's job was XADDed as; set with it, so a retried XADD adds nothing."""
    return f"{PREFIX}enqueued:{request_id}"


def cancel_key(request_id: str) -> str:
    """Exists (with a TTL) once the request is cancelled; workers check it before each step."""
    return f"{PREFIX}cancel:{request_id}"


def stored_response(response_id: str) -> str:
    """A stored Responses-API response (`gateway.responses_api.store`), for GET and previous_response_id."""
    return f"{PREFIX}response:{response_id}"


def worker_heartbeat(worker_id: str) -> str:
    """A worker's heartbeat hash; it expires when the worker stops beating."""
    return f"{PREFIX}worker:{worker_id}"
