"""The worker's Redis calls: reading and claiming jobs, publishing events, finishing jobs.

Every write about a job runs as one Lua script fenced on ownership: the stream entry must still
be pending *for this worker* (XPENDING on the entry id) and the job state's attempt must be this
worker's. A worker presumed dead whose job was reclaimed therefore cannot publish another event,
and a reclaimer never races the old owner's last write. Publishing is also idempotent on `seq`
(the state's `next_seq` says what already landed), so a call retried after a lost reply does not
push an event twice. A batch of events and acknowledgements, of any jobs, is one script call
(`_BATCH`): one round trip, each op fenced and applied in order as if sent alone.

Scripts are called by EVALSHA alone (loaded on NOSCRIPT), never inside a redis-py pipeline, whose
`execute` asks SCRIPT EXISTS first: a second round trip on every publish. The owner thread's
batches go out over a connection of their own without waiting for the reply (`worker.redis_side.publisher`).

Both XAUTOCLAIM reply shapes are handled: Redis 6.2 answers [next, entries] and reports entries
deleted from the stream as [id, nil] inside `entries`; Redis 7+ answers [next, entries, deleted].
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from shared import keys
from shared.protocol import EVENT_LOG_TTL_S, JOB_STATE_TTL_S, JobState, encode_event
from worker.serving.handoff import BatchItem, JobRef, Publication
from worker.serving.step_delta import StepDelta

_OWNED = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
local owned = #pending == 1 and pending[1][2] == ARGV[3]
"""

# KEYS: stream, job state, cancel key, event log.  ARGV: group, entry id, consumer, state ttl.
# Returns nil if the entry is not ours, else {deliveries, state as a flat HGETALL list, cancelled,
# the event log} (what was published before is replayed from the log: see `JobState`).
_CLAIM = (
    _OWNED
    + """
if not owned then return false end
local attempt = pending[1][4]
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('HSET', KEYS[2], 'next_seq', 0)
end
redis.call('HSET', KEYS[2], 'worker', ARGV[3], 'attempt', attempt)
redis.call('EXPIRE', KEYS[2], ARGV[4])
local log = redis.call('LRANGE', KEYS[4], 0, -1)
return {attempt, redis.call('HGETALL', KEYS[2]), redis.call('EXISTS', KEYS[3]), log}
"""
)

# The worker's writes from the owner thread, one call per batch, in order. KEYS: per op, its
# stream, job state and event log.  ARGV: group, consumer, log ttl, state ttl, then per op
# _BATCH_ARGS values: kind ('p' publish, 'c' complete), entry id, then for a publish: attempt,
# seq, event json, channel (a complete leaves them empty).  Returns one result per op, in order:
# 1 applied, 2 applied but no subscriber heard it (PUBLISH reached nobody), 0 a duplicate (seq
# already landed), -1 fenced (not ours).  A publish pushes the event to the log and the channel
# and moves the job state's next_seq past it; a complete acknowledges and deletes the entry and
# drops the state (XACK + XDEL + DEL).
_BATCH_ARGS = 6
_BATCH = (
    """
local function owned(stream, entry)
  local pending = redis.call('XPENDING', stream, ARGV[1], entry, entry, 1)
  return #pending == 1 and pending[1][2] == ARGV[2]
end
local function publish(stream, state, log, entry, attempt, seq, event, channel)
  if not owned(stream, entry) then return -1 end
  local current = redis.call('HGET', state, 'attempt')
  if current and current ~= attempt then return -1 end
  seq = tonumber(seq)
  if tonumber(redis.call('HGET', state, 'next_seq') or '0') > seq then return 0 end
  redis.call('RPUSH', log, event)
  redis.call('EXPIRE', log, ARGV[3])
  local heard = redis.call('PUBLISH', channel, event)
  redis.call('HSET', state, 'worker', ARGV[2], 'attempt', attempt, 'next_seq', seq + 1)
  redis.call('EXPIRE', state, ARGV[4])
  if heard == 0 then return 2 end
  return 1
end
local function complete(stream, state, entry)
  if not owned(stream, entry) then return -1 end
  redis.call('XACK', stream, ARGV[1], entry)
  redis.call('XDEL', stream, entry)
  redis.call('DEL', state)
  return 1
end
local results = {}
for i = 0, #KEYS / 3 - 1 do
  local k, a = 3 * i, 4 + i * """
    + str(_BATCH_ARGS)
    + """
  if ARGV[a + 1] == 'c' then
    results[i + 1] = complete(KEYS[k + 1], KEYS[k + 2], ARGV[a + 2])
  else
    results[i + 1] = publish(KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4],
                             ARGV[a + 5], ARGV[a + 6])
  end
end
return results
"""
)
BATCH_SCRIPT = _BATCH  # the publisher (worker.redis_side.publisher) loads it on its own connection

# KEYS: stream, job state, dead-letter stream.  ARGV: group, entry id, consumer, then the
# dead letter's field/value pairs (none: no dead letter).
_COMPLETE = (
    _OWNED
    + """
if not owned then return -1 end
if #ARGV > 3 then redis.call('XADD', KEYS[3], '*', unpack(ARGV, 4)) end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('DEL', KEYS[2])
return 1
"""
)

# KEYS: stream.  ARGV: group, consumer, entry ids.  Resets the idle time of the given entries that
# are still pending for this consumer (never taking one that was reclaimed meanwhile).
_TOUCH = """
local touched = 0
for i = 3, #ARGV do
  local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if #pending == 1 and pending[1][2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    touched = touched + 1
  end
end
return touched
"""


class PublishResult(enum.IntEnum):
    UNHEARD = 2  # applied, but no subscriber heard it: nobody is streaming this job right now
    APPLIED = 1
    DUPLICATE = 0  # a retry of an event that already landed
    FENCED = -1  # the job is no longer ours: stop working on it


@dataclass(slots=True, frozen=True)
class Claim:
    attempt: int  # the entry's deliveries
    state: JobState  # what earlier attempts published
    cancelled: bool  # the cancel key is set: the client left before the job started


@dataclass(slots=True)
class AutoClaim:
    next_id: str
    entries: list[tuple[str, dict[str, str]]]
    deleted_ids: list[str] = field(default_factory=list)


def parse_autoclaim(reply: list[Any]) -> AutoClaim:
    """XAUTOCLAIM's raw reply, either shape (see the module docstring)."""
    assert len(reply) in (2, 3), f"XAUTOCLAIM reply has {len(reply)} elements"
    claim = AutoClaim(_text(reply[0]), [], [_text(i) for i in reply[2]] if len(reply) == 3 else [])
    for item in reply[1] or []:
        if item is None:
            continue
        entry_id, fields = _text(item[0]), item[1]
        if fields is None:
            claim.deleted_ids.append(entry_id)
        else:
            claim.entries.append((entry_id, _pairs(fields)))
    return claim


class RedisIO:
    def __init__(self, redis: Redis, worker_id: str):
        self.redis = redis
        self.worker_id = worker_id
        # Raw XAUTOCLAIM replies: redis-py's parser chokes on 6.2's deleted-entry shape.
        redis.set_response_callback("XAUTOCLAIM", lambda response, **options: response)
        self._claim = redis.register_script(_CLAIM)
        self._publish = redis.register_script(_BATCH)
        self._complete = redis.register_script(_COMPLETE)
        self._touch = redis.register_script(_TOUCH)

    async def ensure_group(self, stream: str) -> None:
        try:
            await self.redis.xgroup_create(stream, keys.CONSUMER_GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def read_new(self, stream: str, count: int, block_ms: int) -> list[tuple[str, dict[str, str]]]:
        reply = await self.redis.xreadgroup(
            keys.CONSUMER_GROUP, self.worker_id, {stream: ">"}, count=count, block=block_ms
        )
        if not reply:
            return []
        # RESP2 [[stream, entries]] or RESP3 {stream: [entries]}; decode_responses=True: the fields are str
        entries = cast(
            list[tuple[str, dict[str, str] | None]],
            reply[0][1] if isinstance(reply, list) else next(iter(reply.values()))[0],
        )
        return [(_text(entry_id), fields) for entry_id, fields in entries if fields is not None]

    async def read_streams(
        self, streams: Sequence[str], count: int, block_ms: int | None
    ) -> list[tuple[str, str, dict[str, str]]]:
        """(stream, entry id, fields) of new entries, up to `count` from each stream that has any
        (one XREADGROUP over all of them); `block_ms` None: answer at once."""
        reply = await self.redis.xreadgroup(
            keys.CONSUMER_GROUP, self.worker_id, dict.fromkeys(streams, ">"), count=count, block=block_ms
        )
        if not reply:
            return []
        # RESP2 [[stream, entries], ...] or RESP3 {stream: [entries]}
        by_stream = reply if isinstance(reply, list) else [(name, value[0]) for name, value in reply.items()]
        return [
            (_text(stream), _text(entry_id), fields)
            for stream, entries in by_stream
            for entry_id, fields in cast(list[tuple[str, dict[str, str] | None]], entries)
            if fields is not None
        ]

    async def record_prefixes(self, model: str, prefix_hashes: Sequence[str], ttl_s: int) -> None:
        """This worker now holds these prefixes (`shared.placement`): one pipelined call."""
        async with self.redis.pipeline(transaction=False) as pipe:
            for prefix_hash in prefix_hashes:
                pipe.set(keys.prefix_owner(model, prefix_hash), self.worker_id, ex=ttl_s)
            await pipe.execute()

    async def autoclaim(self, stream: str, min_idle_ms: int, count: int, start_id: str = "0-0") -> AutoClaim:
        reply = await self.redis.execute_command(
            "XAUTOCLAIM", stream, keys.CONSUMER_GROUP, self.worker_id, min_idle_ms, start_id, "COUNT", count
        )
        return parse_autoclaim(reply)

    async def idle_owners(self, stream: str, min_idle_ms: int, count: int) -> set[str]:
        """Consumers holding entries idle for at least `min_idle_ms`."""
        pending = await self.redis.xpending_range(
            stream, keys.CONSUMER_GROUP, min="-", max="+", count=count, idle=min_idle_ms
        )
        return {_text(item["consumer"]) for item in pending}

    async def claim(self, stream: str, entry_id: str, request_id: str) -> Claim | None:
        """Take over the job state for the entry we hold, in one round trip; None if not ours."""
        reply = await self._claim(
            keys=[stream, keys.job_state(request_id), keys.cancel_key(request_id), keys.event_log(request_id)],
            args=[keys.CONSUMER_GROUP, entry_id, self.worker_id, JOB_STATE_TTL_S],
        )
        if reply is None:
            return None
        return Claim(int(reply[0]), JobState.from_fields(_pairs(reply[1]), reply[3]), int(reply[2]) == 1)

    async def publish(self, publications: list[Publication]) -> list[PublishResult]:
        """Every event fenced on its own, applied in order, in one script call (one round trip)."""
        if not publications:
            return []
        replies = await self._publish(*batch_call(publications, self.worker_id))
        return [PublishResult(int(reply)) for reply in replies]

    async def complete(self, ref: JobRef, dead_letter: dict[str, str] | None = None) -> bool:
        """XACK + XDEL the entry, DEL the job state, and dead-letter it if asked; False if not ours."""
        return int(await self._complete(*_complete_call(ref, self.worker_id, dead_letter))) == 1

    async def dead_letter_unowned(self, stream: str, entry_id: str, fields: dict[str, str], reason: str) -> None:
        """A malformed entry with no usable id: straight to the dead letters, acknowledged."""
        await self._complete(
            keys=[stream, keys.job_state(fields.get("id") or entry_id), keys.DEAD_LETTER_STREAM],
            args=[
                keys.CONSUMER_GROUP,
                entry_id,
                self.worker_id,
                *_flatten(dead_letter_fields(fields, stream, entry_id, reason, self.worker_id)),
            ],
        )

    async def ack_deleted(self, stream: str, entry_ids: list[str]) -> None:
        if entry_ids:
            await self.redis.xack(stream, keys.CONSUMER_GROUP, *entry_ids)

    async def touch(self, stream: str, entry_ids: list[str]) -> int:
        if not entry_ids:
            return 0
        return int(await self._touch(keys=[stream], args=[keys.CONSUMER_GROUP, self.worker_id, *entry_ids]))


def dead_letter_fields(
    fields: dict[str, str], stream: str, entry_id: str, reason: str, worker_id: str
) -> dict[str, str]:
    """The original job fields plus why, where from, and by whom."""
    return {
        **{name: str(value) for name, value in fields.items()},
        "reason": reason,
        "stream": stream,
        "entry_id": entry_id,
        "dead_lettered_by": worker_id,
    }


def batch_call(items: Sequence[BatchItem], worker_id: str) -> tuple[list[str], list[Any]]:
    """The batch script's keys and args: each publication and acknowledgement in order."""
    script_keys: list[str] = []
    args: list[Any] = [keys.CONSUMER_GROUP, worker_id, EVENT_LOG_TTL_S, JOB_STATE_TTL_S]
    for item in items:
        ref = item.ref
        script_keys += (ref.stream, keys.job_state(ref.request_id), keys.event_log(ref.request_id))
        args += _publish_args(item) if isinstance(item, Publication) else _complete_args(ref)
    return script_keys, args


def _complete_args(ref: JobRef) -> list[Any]:
    return ["c", ref.entry_id, "", "", "", ""]


def _complete_call(ref: JobRef, worker_id: str, dead_letter: dict[str, str] | None) -> tuple[list[str], list[str]]:
    return (
        [ref.stream, keys.job_state(ref.request_id), keys.DEAD_LETTER_STREAM],
        [keys.CONSUMER_GROUP, ref.entry_id, worker_id, *_flatten(dead_letter or {})],
    )


def _publish_args(item: Publication) -> list[Any]:
    ref, event = item.ref, item.event
    encoded = event.to_json() if isinstance(event, StepDelta) else encode_event(event)
    args = ["p", ref.entry_id, ref.attempt, event.seq, encoded, keys.events_channel(ref.request_id)]
    assert len(args) == _BATCH_ARGS
    return args


def _flatten(mapping: dict[str, str]) -> list[str]:
    return [part for name, value in mapping.items() for part in (name, value)]


def _pairs(flat: Any) -> dict[str, str]:
    if isinstance(flat, dict):
        return {_text(k): _text(v) for k, v in flat.items()}
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
