"""Prefix-aware placement: which worker a job is offered to first, and taking an unread offer back.

The gateway has no tokenizer, so a request's prefixes are named by text, as a hash chain over its
messages (a chat) or over fixed chunks of its prompt (a completion):

    h1 = H(model, tools, m1)    h2 = H(h1, m2)    ...    hn = H(h(n-1), mn)

Turn k+1 of a conversation repeats turn k's messages and adds the reply and the next user
message, so its chain holds turn k's whole chain: the deepest hash a worker recorded names the
worker whose prefill cache holds the longest part of this prompt.

    worker, taking a job:   SET prefix_owner(model, h) worker_id EX PREFIX_TTL_S   for each h of the job
    gateway, placing one:   the deepest h whose worker is live, ready and has a lane free
                            (`ROUTE_FUNCTION`, inside the enqueue script) -> XADD to
                            offer_stream(model, worker), else to the class stream
    gateway, offer_wait_s later, unless the job's first event came: `MOVE_SCRIPT` moves the entry,
                            if still unread, to its class stream, where any worker takes it

So a busy or dead worker holds a job for at most the offer wait; one that read it owns it as
before (reclaimed from its offer stream like any pending entry if it dies). Records expire
(bounded by time) and the last writer wins (a prefix served twice is on the later worker).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

PREFIX_TTL_S = 600  # a recorded prefix names its worker this long (the cache may drop it sooner)
MAX_PREFIX_HASHES = 64  # the deepest hashes a job carries (a longer conversation keeps its last ones)
PROMPT_CHUNK_CHARS = 256  # a completion prompt's text is hashed in chunks of this many characters
PROMPT_CHUNK_IDS = 64  # and a prompt given as token ids in chunks of this many ids
ROUTED, SHARED, MOVED = "routed", "shared", "moved"  # placement outcomes (counted per model)

# A Lua function for the enqueue script (`gateway.jobs`), so placing a job costs no round trip of
# its own: route(counts key, heartbeat key prefix, offer stream prefix (offer_stream(model, "")),
# model, first, last) walks ARGV[first..last], the prefix owner keys, deepest first, and returns
# the first worker named that is live, ready, serves the model and has a lane free once the jobs
# already offered to it and not yet finished are counted (counting "routed"), or false ("shared").
ROUTE_FUNCTION = """
local function route(counts, beat_prefix, offer_prefix, model, first, last)
  local tried = {}
  for i = first, last do
    local worker = redis.call('GET', ARGV[i])
    if worker and not tried[worker] then
      tried[worker] = true
      local beat = redis.call('HMGET', beat_prefix .. worker, 'ready', 'lanes_total', 'lanes_busy', 'model')
      if beat[1] == '1' and beat[4] == model then
        local offered = redis.call('XLEN', offer_prefix .. worker)
        if tonumber(beat[2]) - tonumber(beat[3]) - offered > 0 then
          redis.call('HINCRBY', counts, 'routed', 1)
          return worker
        end
      end
    end
  end
  redis.call('HINCRBY', counts, 'shared', 1)
  return false
end
"""

# KEYS: offer stream, class stream, enqueued marker, placement counts.  ARGV: entry id, consumer group.
# Returns the entry's new id in the class stream, or false if it was read (pending, or done and
# deleted) meanwhile: then the offered worker has it.
MOVE_SCRIPT = """
local entries = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[1])
if #entries == 0 then return false end
if #redis.call('XPENDING', KEYS[1], ARGV[2], ARGV[1], ARGV[1], 1) > 0 then return false end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[2], '0', 'MKSTREAM')
end
local moved = redis.call('XADD', KEYS[2], '*', unpack(entries[1][2]))
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('SET', KEYS[3], moved .. '\t' .. KEYS[2], 'KEEPTTL') end
redis.call('HINCRBY', KEYS[4], 'moved', 1)
return moved
"""


def _hash(parent: str, part: str) -> str:
    return hashlib.blake2b(f"{parent}\x00{part}".encode(), digest_size=8).hexdigest()


def chain(root: str, parts: Sequence[str]) -> list[str]:
    """h1 = H(root, parts[0]), h2 = H(h1, parts[1]), ...: the last MAX_PREFIX_HASHES of them."""
    hashes: list[str] = []
    parent = _hash("", root)
    for part in parts:
        parent = _hash(parent, part)
        hashes.append(parent)
    return hashes[-MAX_PREFIX_HASHES:]


def chat_chain(model: str, messages: Sequence[dict[str, Any]], tools: Any = None) -> list[str]:
    """One hash per message, the first also over the model and the tools (they lead the prompt)."""
    root = _canonical({"model": model, "tools": tools})
    return chain(root, [_canonical(message) for message in messages])


def prompt_chain(model: str, prompt: str | Sequence[int]) -> list[str]:
    """One hash per whole chunk of the prompt (a partial last chunk names nothing yet)."""
    if isinstance(prompt, str):
        size, text = PROMPT_CHUNK_CHARS, prompt
        parts = [text[start : start + size] for start in range(0, len(text) - size + 1, size)]
    else:
        size = PROMPT_CHUNK_IDS
        parts = [_canonical(list(prompt[start : start + size])) for start in range(0, len(prompt) - size + 1, size)]
    return chain(_canonical({"model": model}), parts)


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
