"""The Kubernetes manifests (ops/deploy/k8s) are valid, offline, and say what the deployment doc says.

Core resources are checked against Kubernetes' own JSON schemas as the `kubernetes-validate`
wheel bundles them, strictly (an unknown field fails); KEDA's against the schemas vendored in
ops/deploy/k8s/schemas (generated from the `cloudcoil-models-keda` wheel: see its README). The query the
ScaledObject scales on (XLEN of the model's request stream) is run against a real Redis in each
state of a queue (idle, waiting, running, drained), through the same calls the gateway and the
workers make.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

from gateway import jobs
from shared import keys
from shared.openai_schema import ChatCompletionRequest
from shared.redis_connect import async_client, parse_sentinel_url
from tests.support.redis_server import RedisServer
from worker.redis_side.redis_io import BATCH_SCRIPT, batch_call
from worker.serving.handoff import JobDone, JobRef

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "ops" / "deploy" / "k8s"
KUBERNETES_VERSION = "1.30.0"
KEDA_SCHEMAS = {
    "ScaledObject": K8S / "schemas" / "keda.sh-v1alpha1-scaledobject.json",
    "TriggerAuthentication": K8S / "schemas" / "keda.sh-v1alpha1-triggerauthentication.json",
}


def documents() -> list[dict]:
    """What `kubectl kustomize ops/deploy/k8s` builds: the kustomization's resources, in order."""
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return [doc for name in kustomization["resources"] for doc in yaml.safe_load_all((K8S / name).read_text())]


def by_kind(kind: str, name: str) -> dict:
    [doc] = [doc for doc in documents() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return doc


def validate(doc: dict) -> None:
    if doc["kind"] in KEDA_SCHEMAS:
        jsonschema.validate(doc, json.loads(KEDA_SCHEMAS[doc["kind"]].read_text()))
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_every_manifest_validates_against_the_kubernetes_and_keda_schemas() -> None:
    kinds = sorted(doc["kind"] for doc in documents())
    assert kinds == ["ConfigMap", "Deployment", "Deployment", "ScaledObject", "Service", "TriggerAuthentication"]
    for doc in documents():
        validate(doc)


@pytest.mark.parametrize("kind", ["Deployment", "ScaledObject"])
def test_a_misspelt_field_fails_validation(kind: str) -> None:
    doc = by_kind(kind, "arbor-worker")
    doc["spec"]["replicaCuont" if kind == "Deployment" else "maxReplicaCuont"] = 3
    with pytest.raises((kubernetes_validate.ValidationError, jsonschema.ValidationError)):
        validate(doc)


def test_kubectl_kustomize_builds_the_same_resources() -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed; the resources are read as the kustomization lists them")
    built = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True).stdout
    names = sorted((doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(built))
    assert names == sorted((doc["kind"], doc["metadata"]["name"]) for doc in documents())


def container(name: str) -> dict:
    [only] = by_kind("Deployment", name)["spec"]["template"]["spec"]["containers"]
    return only


def env_of(name: str) -> dict[str, str]:
    return {item["name"]: item.get("value", "") for item in container(name)["env"]}


def test_liveness_is_not_health_so_an_empty_worker_pool_restarts_no_gateway() -> None:
    gateway = container("arbor-gateway")
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/readyz"
    worker = container("arbor-worker")
    assert worker["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert worker["startupProbe"]["httpGet"]["path"] == worker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_grace_period_covers_the_workers_drain() -> None:
    spec = by_kind("Deployment", "arbor-worker")["spec"]["template"]["spec"]
    drain_s = float(env_of("arbor-worker")["ARBOR_DRAIN_GRACE_S"])
    assert "kill -TERM 1" in " ".join(container("arbor-worker")["lifecycle"]["preStop"]["exec"]["command"])
    assert spec["terminationGracePeriodSeconds"] >= drain_s + 15


def test_the_redis_url_the_pods_build_is_a_sentinel_url() -> None:
    config = by_kind("ConfigMap", "arbor-redis")["data"]
    for name in ("arbor-gateway", "arbor-worker"):
        env = env_of(name) | {"REDIS_PASSWORD": "pw", "REDIS_SENTINELS": config["sentinels"]}
        env["REDIS_MASTER"] = config["master-name"]
        url = re.sub(r"\$\((\w+)\)", lambda match, env=env: env[match.group(1)], env["REDIS_URL"])
        target = parse_sentinel_url(url)
        assert target is not None and target.master_name == "mymaster" and target.password == "pw"
        assert len(target.sentinels) == 3


def scaled_trigger() -> dict:
    [trigger] = by_kind("ScaledObject", "arbor-worker")["spec"]["triggers"]
    return trigger["metadata"]


def test_keda_scales_on_the_stream_of_the_workers_model_one_worker_per_lane_count() -> None:
    trigger, env = scaled_trigger(), env_of("arbor-worker")
    assert trigger["stream"] == keys.request_stream(env["MODEL"])
    assert trigger["streamLength"] == env["ARBOR_MAX_LANES"]
    assert by_kind("ScaledObject", "arbor-worker")["spec"]["minReplicaCount"] >= 1, "admission needs a live worker"


def desired_workers(client: redis.Redis) -> int:
    """What KEDA computes from the trigger: ceil(XLEN / streamLength), within min and max."""
    spec = by_kind("ScaledObject", "arbor-worker")["spec"]
    length = client.xlen(scaled_trigger()["stream"])
    wanted = math.ceil(length / int(scaled_trigger()["streamLength"]))
    return max(spec["minReplicaCount"], min(spec["maxReplicaCount"], wanted))


def enqueue(url: str, count: int) -> None:
    model = env_of("arbor-worker")["MODEL"]
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}

    async def main() -> None:
        client = async_client(url, 2.0)
        for number in range(count):
            request = ChatCompletionRequest.model_validate(body)
            job = jobs.new_job("chat", request, 16, 60.0, lambda p, n=number: f"{p}-{n}")
            await jobs.enqueue(client, job, 1000)
        await client.aclose()

    asyncio.run(main())


def test_the_keda_query_counts_waiting_and_running_jobs_in_every_state_of_the_queue() -> None:
    stream = scaled_trigger()["stream"]
    with RedisServer() as server, server.client(decode_responses=True) as client:
        assert (client.xlen(stream), desired_workers(client)) == (0, 1), "idle: no stream yet, still a number"
        enqueue(server.url, 20)
        assert (client.xlen(stream), desired_workers(client)) == (20, 3), "waiting: 20 jobs, 8 lanes a worker"
        # the gateway's enqueue made the workers' consumer group with the stream
        [[_, taken]] = client.xreadgroup(keys.CONSUMER_GROUP, "w1", {stream: ">"}, count=8)
        assert (client.xlen(stream), desired_workers(client)) == (20, 3), "running: 8 in flight + 12 waiting"
        [[_, rest]] = client.xreadgroup(keys.CONSUMER_GROUP, "w1", {stream: ">"}, count=100)
        done = [JobDone(JobRef(fields["id"], stream, entry_id, 1)) for entry_id, fields in taken + rest]
        script_keys, args = batch_call(done, "w1")  # how a worker acknowledges: XACK + XDEL
        assert client.register_script(BATCH_SCRIPT)(script_keys, args) == [1] * 20
        assert (client.xlen(stream), desired_workers(client)) == (0, 1), "drained: back to the floor"
