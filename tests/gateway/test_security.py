"""Security basics on every /v1 route: API keys enforced when configured, body size and max_tokens capped.

The routes are read from the app itself. A new /v1 route fails `test_every_v1_route_has_an_example`
until it gets an example request here, and from then on every test below covers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from starlette.routing import Mount, Route

from gateway.app import create_app
from shared.settings import GatewaySettings
from tests.gateway.conftest import MODEL, GatewayServer
from tests.gateway.protocol_peer import ProtocolPeer

API_KEY = "sk-arbor-right-key"
KEYS = f"{API_KEY},sk-arbor-other-key"
MAX_TOKENS_CAP = 64
MAX_BODY_BYTES = 2048

# (method, path) -> a valid request body (None: no body). Every /v1 route must be here.
EXAMPLES: dict[tuple[str, str], dict | None] = {
    ("POST", "/v1/chat/completions"): {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
    },
    ("POST", "/v1/completions"): {"model": MODEL, "prompt": "hi", "max_tokens": 4},
    ("POST", "/v1/messages"): {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    ("POST", "/v1/messages/count_tokens"): {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    ("GET", "/v1/models"): None,
    ("HEAD", "/v1/models"): None,
    ("GET", "/v1/models/{model:path}"): None,
    ("HEAD", "/v1/models/{model:path}"): None,
    ("POST", "/v1/responses"): {"model": MODEL, "input": "hi", "max_output_tokens": 4},
    ("GET", "/v1/responses/{response_id}"): None,
    ("HEAD", "/v1/responses/{response_id}"): None,
    ("DELETE", "/v1/responses/{response_id}"): None,
}
URLS = {  # a route's path with its parameters filled in
    "/v1/models/{model:path}": f"/v1/models/{MODEL}",
    "/v1/responses/{response_id}": "/v1/responses/resp-none",
}
# What an authorized request gets where it is not 200: a stored response that does not exist.
AUTHORIZED_STATUS = {route: 404 for route in EXAMPLES if route[1] == "/v1/responses/{response_id}"}
MAX_TOKENS_FIELDS = ("max_tokens", "max_output_tokens")
GENERATION_ROUTES = [
    route for route, body in EXAMPLES.items() if body is not None and set(MAX_TOKENS_FIELDS) & set(body)
]
JOB_ROUTES = [route for route, body in EXAMPLES.items() if body is not None]  # each request is one job
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 413: "request_too_large"}
BAD_HEADERS = [
    None,
    "Bearer wrong",
    f"Bearer {API_KEY}x",
    f"Bearer {API_KEY[:-1]}",
    f"Basic {API_KEY}",
    "Bearer",
    API_KEY,
    f"Bearer {KEYS}",
]


def v1_routes(routes: list, prefix: str = "") -> set[tuple[str, str]]:
    """(method, path) of every route under /v1, looking inside mounts."""
    found: set[tuple[str, str]] = set()
    for route in routes:
        if isinstance(route, Mount):
            found |= v1_routes(route.routes, prefix + route.path)
        elif isinstance(route, Route) and (prefix + route.path).startswith("/v1"):
            found |= {(method, prefix + route.path) for method in route.methods or ()}
    return found


def _send(gateway: GatewayServer, route: tuple[str, str], header: str | None = None, **changes):
    method, path = route
    headers = {"authorization": header} if header is not None else {}
    body = EXAMPLES[route]
    json_body = None if body is None else body | changes
    return gateway.http().request(method, URLS.get(path, path), json=json_body, headers=headers)


def _assert_envelope(response, status: int, code: str) -> dict:
    """OpenAI's envelope, or on the Messages API's paths Anthropic's (which has no code)."""
    assert response.status_code == status, response.text
    if response.request.url.path.startswith("/v1/messages"):
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["error"]["type"] == ANTHROPIC_TYPES[status], body
        return body["error"] | {"type": _TYPES_AS_OPENAI[status]}
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    return error


_TYPES_AS_OPENAI = {400: "invalid_request_error", 401: "authentication_error", 413: "invalid_request_error"}


def test_every_v1_route_has_an_example() -> None:
    app = create_app(GatewaySettings(api_keys=KEYS))
    assert v1_routes(app.routes) == set(EXAMPLES), "add an example request for each new /v1 route"


@pytest.mark.parametrize("header", BAD_HEADERS)
def test_every_v1_route_refuses_a_missing_or_wrong_key(make_gateway, peer: ProtocolPeer, header: str | None) -> None:
    gateway = make_gateway(api_keys=KEYS)

    for route in EXAMPLES:
        response = _send(gateway, route, header)
        if route[0] == "HEAD":
            assert response.status_code == 401, route
        else:
            error = _assert_envelope(response, 401, "invalid_api_key")
            assert error["type"] == "authentication_error"
    assert peer.jobs == [], "nothing reached the queue"


def test_every_v1_route_serves_a_configured_key(make_gateway, peer: ProtocolPeer) -> None:
    gateway = make_gateway(api_keys=KEYS)

    for key in KEYS.split(","):
        for route in EXAMPLES:
            response = _send(gateway, route, f"Bearer {key}")
            assert response.status_code == AUTHORIZED_STATUS.get(route, 200), (route, response.text)
    assert len(peer.jobs) == 2 * len(JOB_ROUTES)


@pytest.mark.parametrize("route", JOB_ROUTES)
def test_a_body_over_the_size_cap_is_413(make_gateway, peer: ProtocolPeer, route: tuple[str, str]) -> None:
    gateway = make_gateway(api_keys=KEYS, max_body_bytes=MAX_BODY_BYTES)
    padding = {"user": "x" * MAX_BODY_BYTES}  # an accepted field, so only the size is wrong
    headers = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}

    declared = _send(gateway, route, f"Bearer {API_KEY}", **padding)
    content = gateway.http().request(
        route[0], route[1], headers=headers, content=_chunks(EXAMPLES[route] | padding)
    )  # no content-length

    _assert_envelope(declared, 413, "request_too_large")
    _assert_envelope(content, 413, "request_too_large")
    assert _send(gateway, route, f"Bearer {API_KEY}").status_code == 200
    assert len(peer.jobs) == 1


def _chunks(body: dict) -> Iterator[bytes]:
    raw = json.dumps(body).encode()
    for start in range(0, len(raw), 256):
        yield raw[start : start + 256]


@pytest.mark.parametrize("route", GENERATION_ROUTES)
def test_max_tokens_over_the_cap_is_lowered_to_it(make_gateway, peer: ProtocolPeer, route: tuple[str, str]) -> None:
    """Agent CLIs ask for 32000 tokens whatever the model: refusing would refuse every request."""
    gateway = make_gateway(api_keys=KEYS, max_tokens_cap=MAX_TOKENS_CAP, default_max_tokens=MAX_TOKENS_CAP)

    [field] = set(MAX_TOKENS_FIELDS) & set(EXAMPLES[route] or {})
    over = _send(gateway, route, f"Bearer {API_KEY}", **{field: 32000})

    assert over.status_code == 200, over.text
    assert [job.request()["max_tokens"] for job in peer.jobs] == [MAX_TOKENS_CAP]
