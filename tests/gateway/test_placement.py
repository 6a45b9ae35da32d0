"""The gateway's placement: prefix chains, an offer to the prefix's worker, and an unread offer
taken back after the offer wait (a stand-in worker that beats as live but never reads)."""

from __future__ import annotations

import time

from gateway.jobs import prefix_hashes
from shared import keys
from shared.heartbeat import Heartbeat
from shared.openai_schema import ChatCompletionRequest, CompletionRequest
from tests.gateway.conftest import MODEL
from tests.support.waiting import wait_for

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a fox."}]


def chat(messages: list[dict]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages})


def test_a_next_turn_chain_holds_the_previous_turn_chain():
    first = prefix_hashes(chat(MESSAGES))
    reply = {"role": "assistant", "content": "Vulpes."}
    second = prefix_hashes(chat([*MESSAGES, reply, {"role": "user", "content": "Another?"}]))
    assert len(first) == 2 and second[:2] == first and len(second) == 4
    other_system = prefix_hashes(chat([{"role": "system", "content": "Be long."}, MESSAGES[1]]))
    assert set(other_system).isdisjoint(first)  # a hash names the whole prefix before it


def test_a_prompt_chain_names_whole_chunks_only():
    def chain(prompt: str) -> list[str]:
        return prefix_hashes(CompletionRequest.model_validate({"model": MODEL, "prompt": prompt}))

    assert chain("x" * 255) == []
    assert len(chain("x" * 600)) == 2 and chain("x" * 600)[:1] == chain("x" * 300)


def ghost_beat(redis_client, worker_id: str, lanes_busy: int = 0) -> None:
    """A worker that looks live and ready with free lanes, and never reads anything."""
    now = time.time()
    beat = Heartbeat(
        worker_id=worker_id,
        model=MODEL,
        speculation="none",
        ready=True,
        lanes_total=4,
        lanes_busy=lanes_busy,
        started_at=now,
        beat_at=now,
    )
    redis_client.hset(keys.worker_heartbeat(worker_id), mapping=beat.to_fields())
    redis_client.expire(keys.worker_heartbeat(worker_id), 60)
    redis_client.sadd(keys.WORKERS_SET, worker_id)


def test_an_offer_left_unread_is_taken_back_and_served_by_another(make_gateway, peer, redis_client):
    gateway = make_gateway(offer_wait_s=0.2)
    ghost_beat(redis_client, "ghost")
    for prefix_hash in prefix_hashes(chat(MESSAGES)):
        redis_client.set(keys.prefix_owner(MODEL, prefix_hash), "ghost")
    reply = gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].message.content == "Hello, world"
    assert [job.id for job in peer.jobs] == [reply.id]
    assert redis_client.hgetall(keys.placement_counts(MODEL)) == {"routed": "1", "moved": "1"}
    assert redis_client.xlen(keys.offer_stream(MODEL, "ghost")) == 0


def test_a_busy_holder_is_passed_over(make_gateway, peer, redis_client):
    gateway = make_gateway(offer_wait_s=30)  # an offer would stall the request: it must not be made
    ghost_beat(redis_client, "ghost", lanes_busy=4)
    for prefix_hash in prefix_hashes(chat(MESSAGES)):
        redis_client.set(keys.prefix_owner(MODEL, prefix_hash), "ghost")
    reply = gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert reply.choices[0].message.content == "Hello, world"
    assert redis_client.hgetall(keys.placement_counts(MODEL)) == {"shared": "1"}


def test_placement_off_offers_nothing(make_gateway, peer, redis_client):
    gateway = make_gateway(placement=False)
    ghost_beat(redis_client, "ghost")
    for prefix_hash in prefix_hashes(chat(MESSAGES)):
        redis_client.set(keys.prefix_owner(MODEL, prefix_hash), "ghost")
    gateway.openai().chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
    assert redis_client.hgetall(keys.placement_counts(MODEL)) == {}


def test_a_client_leaving_takes_its_unread_offer_back_for_a_live_worker_to_drop(make_gateway, make_peer, redis_client):
    make_peer(consume=False)  # a ready worker that reads nothing: what is moved stays to be seen
    gateway = make_gateway(offer_wait_s=30)  # the offer wait never ends within the test
    ghost_beat(redis_client, "ghost")
    for prefix_hash in prefix_hashes(chat(MESSAGES)):
        redis_client.set(keys.prefix_owner(MODEL, prefix_hash), "ghost")
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "stream": True}
    with gateway.http().stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        wait_for(lambda: redis_client.xlen(keys.offer_stream(MODEL, "ghost")) == 1, 10, "the offer")
    wait_for(lambda: redis_client.xlen(keys.offer_stream(MODEL, "ghost")) == 0, 10, "the offer taken back")
    # the move, its count and the cancel mark are separate writes of the leaving request: wait for each
    wait_for(lambda: redis_client.hget(keys.placement_counts(MODEL), "moved") == "1", 10, "the move counted")
    wait_for(lambda: redis_client.xlen(keys.request_stream(MODEL)) == 1, 10, "the job moved to the shared stream")
    [(_, fields)] = redis_client.xrange(keys.request_stream(MODEL))
    wait_for(lambda: redis_client.exists(keys.cancel_key(fields["id"])), 10, "the cancel mark")  # a reader drops it
