"""/tokenize, /detokenize and /tokenizer_info through the gateway, with a protocol peer as the
worker: the gates (API keys, body cap, validation in the OpenAI envelope, admission) and the
job they become. The answers themselves come from a real worker in tests/e2e/test_prompt_scoring.py."""

from __future__ import annotations

from shared.protocol import Job
from tests.gateway.conftest import MODEL
from tests.gateway.protocol_peer import ProtocolPeer, Step, final

API_KEY = "sk-arbor-tokenizer-key"
AUTH = {"authorization": f"Bearer {API_KEY}"}
REPLIES = {
    "tokenize": {"count": 2, "max_model_len": 64, "tokens": [5, 6], "token_strs": None},
    "detokenize": {"prompt": "hi"},
    "info": {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": "{{ x }}"},
}
CALLS = [
    ("POST", "/tokenize", {"prompt": "hi", "add_special_tokens": False}, "tokenize"),
    ("POST", "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "tokenize"),
    ("POST", "/detokenize", {"tokens": [5, 6]}, "detokenize"),
    ("GET", "/tokenizer_info", None, "info"),
]


def answering(job: Job) -> list[Step]:
    op = job.request()["op"]
    return [final(prompt_tokens=0, completion_tokens=0, result=REPLIES[op])]


def test_each_endpoint_answers_with_its_jobs_result(make_gateway, make_peer) -> None:
    peer: ProtocolPeer = make_peer(script=answering)
    gateway = make_gateway()
    for method, path, body, op in CALLS:
        response = gateway.http().request(method, path, json=body)
        assert response.status_code == 200, response.text
        assert response.json() == REPLIES[op]
    assert [(job.kind, job.model, job.request()["op"]) for job in peer.jobs] == [
        ("tokenize", MODEL, op) for *_, op in CALLS
    ]
    asked = peer.jobs[0].request()["tokenize"]
    assert (asked["prompt"], asked["add_special_tokens"]) == ("hi", False)


def test_a_key_is_needed_where_keys_are_configured(make_gateway, make_peer) -> None:
    peer: ProtocolPeer = make_peer(script=answering)
    gateway = make_gateway(api_keys=API_KEY)
    for method, path, body, _ in CALLS:
        refused = gateway.http().request(method, path, json=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", path
    assert peer.jobs == []
    for method, path, body, _ in CALLS:
        assert gateway.http().request(method, path, json=body, headers=AUTH).status_code == 200
    assert len(peer.jobs) == len(CALLS)


def test_a_body_over_the_cap_is_413(make_gateway, make_peer) -> None:
    peer: ProtocolPeer = make_peer(script=answering)
    gateway = make_gateway(max_body_bytes=1024)
    response = gateway.http().post("/tokenize", json={"prompt": "x" * 1100})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    response = gateway.http().post("/detokenize", json={"tokens": list(range(400))})
    assert response.status_code == 413
    assert peer.jobs == []


def test_bad_input_is_a_400_naming_the_field_and_queues_nothing(make_gateway, make_peer) -> None:
    peer: ProtocolPeer = make_peer(script=answering)
    gateway = make_gateway()
    cases = [
        ("/tokenize", {"add_special_tokens": True}, "prompt"),  # neither prompt nor messages
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"prompt": 5}, "prompt"),
        ("/tokenize", {"messages": [{"role": "user", "content": "b"}], "continue_final_message": True}, None),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": "12"}, "tokens"),
    ]
    for path, body, param in cases:
        response = gateway.http().post(path, json=body)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["code"] == "invalid_request", error
        if param is not None:
            assert error["param"] == param, (body, error)
    assert gateway.http().post("/tokenize", content=b"{not json").status_code == 400
    strict = make_gateway(strict_request_fields=True).http().post("/tokenize", json={"prompt": "a", "temperature": 1})
    assert strict.status_code == 400 and strict.json()["error"]["param"] == "temperature"
    assert peer.jobs == []


def test_an_unknown_model_is_404_and_a_missing_one_needs_a_single_served_model(make_gateway, make_peer) -> None:
    make_peer(script=answering)
    make_peer(script=answering, model="second-model", worker_id="peer-second-model")
    gateway = make_gateway()
    response = gateway.http().post("/tokenize", json={"model": "nope", "prompt": "a"})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    response = gateway.http().post("/tokenize", json={"prompt": "a"})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "model" and MODEL in error["message"] and "second-model" in error["message"]
    assert gateway.http().get("/tokenizer_info", params={"model": "second-model"}).status_code == 200
