"""/v1/models, /health, /metrics and /openapi.json, read from live heartbeats and queues."""

from __future__ import annotations

import re

import redis

from shared import keys
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import Counters, ProtocolPeer, lost
from tests.gateway.protocol_peer import delta as delta_step
from tests.gateway.protocol_peer import final as final_step


def test_models_lists_what_live_workers_serve(gateway: GatewayServer, make_peer) -> None:
    make_peer(worker_id="a")
    make_peer(worker_id="b")
    make_peer(worker_id="c", model="other-model", ready=False)

    models = gateway.openai().models.list()

    assert [m.id for m in models.data] == ["other-model", MODEL]
    assert all(m.object == "model" and m.owned_by == "arbor" for m in models.data)
    assert models.data[1].model_extra["max_model_len"] == 2048


def test_a_model_is_retrieved_by_id_slashes_and_all(gateway: GatewayServer, make_peer) -> None:
    make_peer(worker_id="a")
    make_peer(worker_id="b", model="org/other-model")

    assert gateway.openai().models.retrieve(MODEL).id == MODEL
    assert gateway.openai().models.retrieve("org/other-model").id == "org/other-model"
    response = gateway.http().get("/v1/models/no-such-model")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"
    metrics = gateway.http().get("/metrics").text
    assert _sample(metrics, "arbor_http_requests_total", route="/v1/models/{model}", status="404") == 1


def test_models_is_empty_without_workers(gateway: GatewayServer) -> None:
    assert gateway.openai().models.list().data == []


def test_health_is_200_with_a_ready_worker_and_lists_workers(gateway: GatewayServer, peer: ProtocolPeer) -> None:
    response = gateway.http().get("/health")

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok" and body["redis"] is True
    [worker] = body["workers"]
    assert worker["id"] == peer.worker_id and worker["model"] == MODEL
    assert worker["speculation"] == "mtp" and worker["ready"] is True
    assert (worker["lanes_total"], worker["lanes_busy"]) == (4, 0)
    assert 0 <= worker["heartbeat_age_s"] < 5


def test_health_is_503_without_a_ready_worker(gateway: GatewayServer, make_peer) -> None:
    assert gateway.http().get("/health").status_code == 503
    make_peer(ready=False)
    response = gateway.http().get("/health")
    assert response.status_code == 503
    assert len(response.json()["workers"]) == 1


def test_health_is_503_when_redis_is_unreachable(make_gateway) -> None:
    gateway = make_gateway(redis_url="unix:///tmp/arbor-no-such-redis.sock", redis_timeout_s=0.5)

    response = gateway.http().get("/health")

    assert response.status_code == 503
    assert response.json()["redis"] is False
    chat = gateway.http().post(
        "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
    )
    assert chat.status_code == 503
    assert chat.json()["error"]["code"] == "redis_unavailable"


def _sample(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}(\{{{re.escape(wanted)}\}})? (\S+)$" if labels else rf"^{re.escape(name)} (\S+)$"
    for line in text.splitlines():
        match = re.match(pattern, line)
        if match:
            return float(match.groups()[-1])
    raise AssertionError(f"{name}{{{wanted}}} not in metrics")


def test_metrics_sum_speculation_counters_across_workers(gateway: GatewayServer, make_peer) -> None:
    make_peer(worker_id="a", counters=Counters(drafts=10, draft_tokens=40, accepted_tokens=25, prefix_cache_hits=3))
    make_peer(worker_id="b", counters=Counters(drafts=5, draft_tokens=20, accepted_tokens=5, prefix_cache_queries=9))
    make_peer(worker_id="c", speculation="tree", counters=Counters(drafts=1))

    text = gateway.http().get("/metrics").text

    mtp = {"model": MODEL, "speculation": "mtp"}
    assert _sample(text, "arbor_spec_drafts_total", **mtp) == 15
    assert _sample(text, "arbor_spec_draft_tokens_total", **mtp) == 60
    assert _sample(text, "arbor_spec_accepted_tokens_total", **mtp) == 30
    assert _sample(text, "arbor_prefix_cache_hits_total", **mtp) == 3
    assert _sample(text, "arbor_prefix_cache_queries_total", **mtp) == 9
    assert _sample(text, "arbor_spec_drafts_total", model=MODEL, speculation="tree") == 1
    assert _sample(text, "arbor_workers_live", **mtp) == 2
    assert _sample(text, "arbor_lanes_total", **mtp) == 8
    assert _sample(text, "arbor_redis_up") == 1


def test_metrics_report_queue_depth_and_age(gateway: GatewayServer, make_peer, redis_client: redis.Redis) -> None:
    make_peer(consume=False)
    stream = keys.request_stream(MODEL)
    for i in range(3):
        redis_client.xadd(stream, {"id": f"x{i}"}, id=f"{1000 + i}-0")  # ids from 1970: very old
    redis_client.xreadgroup(keys.CONSUMER_GROUP, "someone", {stream: ">"}, count=1)

    text = gateway.http().get("/metrics").text

    assert _sample(text, "arbor_queue_waiting", model=MODEL) == 2
    assert _sample(text, "arbor_queue_pending", model=MODEL) == 1
    assert _sample(text, "arbor_queue_oldest_age_seconds", model=MODEL) > 1e9


def test_metrics_count_the_restarts_arbor_up_made(gateway: GatewayServer, redis_client: redis.Redis) -> None:
    assert "arbor_process_restarts_total{" not in gateway.http().get("/metrics").text, "none before any restart"
    redis_client.hincrby(keys.PROCESS_RESTARTS, "worker-2", 3)
    redis_client.hincrby(keys.PROCESS_RESTARTS, "gateway", 1)

    text = gateway.http().get("/metrics").text

    assert _sample(text, "arbor_process_restarts_total", process="worker-2") == 3
    assert _sample(text, "arbor_process_restarts_total", process="gateway") == 1


def test_request_metrics_count_latency_tokens_and_repairs(gateway: GatewayServer, make_peer) -> None:
    make_peer(
        script=lambda job: [
            delta_step("a"),
            lost(delta_step("b")),
            delta_step("c"),
            final_step(completion_tokens=3),
        ]
    )
    client = gateway.openai()
    list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True))
    gateway.http().post("/v1/chat/completions", json={"model": "nope", "messages": []})

    text = gateway.http().get("/metrics").text

    assert _sample(text, "arbor_time_to_first_token_seconds_count") == 1
    assert _sample(text, "arbor_inter_token_latency_seconds_count") == 2
    assert _sample(text, "arbor_e2e_request_latency_seconds_count") == 1
    assert _sample(text, "arbor_prompt_tokens_total") == 7
    assert _sample(text, "arbor_generation_tokens_total") == 3
    assert _sample(text, "arbor_request_success_total", finish_reason="stop") == 1
    assert _sample(text, "arbor_event_repairs_total") >= 1
    assert _sample(text, "arbor_rejections_total", reason="invalid_request") == 1
    assert _sample(text, "arbor_http_requests_total", route="/v1/chat/completions", status="200") == 1
    assert _sample(text, "arbor_http_requests_total", route="/v1/chat/completions", status="400") == 1
    assert _sample(text, "arbor_requests_running") == 0


def test_openapi_describes_the_request_models(gateway: GatewayServer) -> None:
    spec = gateway.http().get("/openapi.json").json()

    assert spec["openapi"].startswith("3.")
    routes = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/models/{model}", "/health", "/metrics"}
    assert routes <= set(spec["paths"])
    schemas = spec["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert {"messages", "model", "tools", "stream_options", "reasoning_budget"} <= set(chat["properties"])
    assert chat["additionalProperties"] is True  # unknown fields are ignored (and counted)
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    ref = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.rsplit("/", 1)[-1] in schemas


def test_metrics_sum_each_draft_source_across_workers(gateway: GatewayServer, make_peer) -> None:
    mtp_only = {"mtp": {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 7}}
    both = mtp_only | {"suffix": {"drafts": 2, "draft_tokens": 9, "accepted_tokens": 8}}
    make_peer(worker_id="a", counters=Counters(draft_sources=mtp_only))
    make_peer(worker_id="b", counters=Counters(draft_sources=both))

    text = gateway.http().get("/metrics").text

    mtp = {"model": MODEL, "source": "mtp", "speculation": "mtp"}
    suffix = mtp | {"source": "suffix"}
    assert _sample(text, "arbor_spec_source_drafts_total", **mtp) == 8
    assert _sample(text, "arbor_spec_source_draft_tokens_total", **mtp) == 24
    assert _sample(text, "arbor_spec_source_accepted_tokens_total", **mtp) == 14
    assert _sample(text, "arbor_spec_source_draft_tokens_total", **suffix) == 9
    assert _sample(text, "arbor_spec_source_accepted_tokens_total", **suffix) == 8


def test_the_probes_keep_a_gateway_with_no_ready_worker_alive_and_ready(make_gateway) -> None:
    gateway = make_gateway(api_keys=("k",), auth_health_metrics=True)
    http = gateway.http()
    assert http.get("/health").status_code == 401, "the fleet view needs a key here"
    assert http.get("/livez").json() == {"status": "ok"}, "no key, no worker: alive"
    assert http.get("/readyz").json() == {"status": "ok"}, "Redis answers: ready for requests"


def test_readyz_is_503_and_livez_200_when_redis_is_unreachable(make_gateway) -> None:
    gateway = make_gateway(redis_url="unix:///tmp/arbor-no-such-redis.sock", redis_timeout_s=0.5)
    assert gateway.http().get("/readyz").status_code == 503
    assert gateway.http().get("/livez").status_code == 200, "a Redis outage must not restart the gateway"
