"""`arbor bench serving`'s goals per mode, and --base-url against a real OpenAI-style HTTP server
(a small Starlette app on uvicorn that streams SSE chunks the way vLLM and llama-server do).
No timings are asserted: only counts, ratios of given figures, and what the server received."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ops.bench.serving_goals import with_goals
from ops.bench.serving_report import serving_markdown
from ops.cli import main


def level(concurrency: int, tokens_per_s: float | None, itl_p50_ms: float | None) -> dict:
    latency = {"p50": 1.0, "p99": 2.0, "n": 1}
    return {
        "concurrency": concurrency,
        "requests": 2 * concurrency,
        "ok": 2 * concurrency,
        "errors": 0,
        "requests_per_s": 1.0,
        "output_tokens_per_s": tokens_per_s,
        "ttft_ms": latency,
        "itl_ms": {**latency, "p50": itl_p50_ms},
        "tpot_ms": latency,
        "e2e_ms": latency,
    }


def test_goals_divide_16_streams_by_1_and_each_mode_by_none_at_each_level():
    none = [level(1, 40.0, 25.0), level(4, 80.0, 30.0), level(16, 120.0, 50.0)]
    mtp = [level(1, 60.0, 20.0), level(4, 80.0, 30.0), level(16, 150.0, 60.0)]
    goals = {
        run["mode"]: run["goals"]
        for run in with_goals([{"mode": "none", "sweep": none}, {"mode": "mtp", "sweep": mtp}])
    }
    assert goals["none"] == {"tokens_per_s_16_over_1": 3.0, "itl_p50_16_over_1": 2.0, "tokens_per_s_over_none": None}
    assert goals["mtp"] == {
        "tokens_per_s_16_over_1": 2.5,
        "itl_p50_16_over_1": 3.0,
        "tokens_per_s_over_none": {"1": 1.5, "4": 1.0, "16": 1.25},
    }


def test_goals_are_none_where_a_level_or_the_none_mode_did_not_run():
    (alone,) = with_goals([{"mode": "none", "sweep": [level(1, 40.0, 25.0), level(8, 90.0, 40.0)]}])
    assert alone["goals"] == {"tokens_per_s_16_over_1": None, "itl_p50_16_over_1": None, "tokens_per_s_over_none": None}
    ngram, mtp = with_goals(
        [{"mode": m, "sweep": [level(1, 10.0, None), level(16, 0.0, 5.0)]} for m in ("ngram", "mtp")]
    )
    assert ngram["goals"]["tokens_per_s_over_none"] is None and mtp["goals"]["tokens_per_s_over_none"] is None
    assert ngram["goals"]["tokens_per_s_16_over_1"] == 0.0 and ngram["goals"]["itl_p50_16_over_1"] is None
    (zero,) = with_goals([{"mode": "none", "sweep": [level(1, 0.0, 25.0), level(16, 10.0, 50.0)]}])
    assert zero["goals"]["tokens_per_s_16_over_1"] is None, "nothing at 1 stream: no ratio, no ZeroDivisionError"


def test_the_markdown_has_one_table_and_one_goals_line_per_mode():
    modes = with_goals(
        [
            {"mode": "none", "sweep": [level(1, 40.0, 25.0), level(16, 120.0, 50.0)]},
            {"mode": "ngram", "sweep": [level(1, 50.0, 25.0), level(16, 90.0, 50.0)]},
        ]
    )
    markdown = serving_markdown(stack_report(modes))
    none_at, ngram_at = markdown.index("speculation `none` (1 worker(s))"), markdown.index("speculation `ngram`")
    assert none_at < ngram_at
    assert markdown.count("| streams | requests | errors |") == 2
    assert "| 16 | 32 | 0 | 1.00 | 120.0 |" in markdown[none_at:ngram_at]
    assert "| 16 | 32 | 0 | 1.00 | 90.0 |" in markdown[ngram_at:]
    assert "output tokens/s at 16 streams ÷ at 1: 3.00x; ITL p50 at 16 streams ÷ at 1: 2.00x." in markdown
    assert "output tokens/s ÷ `none`'s: 1.25x at 1, 0.75x at 16." in markdown[ngram_at:]


def stack_report(modes: list[dict]) -> dict:
    return {
        "timestamp": "2026-01-01 00:00:00",
        "machine": {"cpu_count": 2, "load_average_1m": 0.5},
        "settings": {
            "model": "tiny",
            "base_url": None,
            "max_tokens": 8,
            "ignore_eos": True,
            "temperature": 0.0,
            "speculation": [run["mode"] for run in modes],
            "dtype": "float32",
            "worker_counts": [1],
            "max_lanes_per_worker": 8,
            "worker_threads": 1,
        },
        "comparison": None,
        "modes": modes,
        "scaling": [],
        "scaling_speedup": {},
        "total_errors": 0,
    }


class OpenAIStyleServer:
    """GET /v1/models lists `models`; POST /v1/chat/completions streams max_tokens one-token chunks
    (CRLF-framed, `data:` without a space, as SSE allows), a usage chunk and [DONE]."""

    def __init__(self, models: list[str]) -> None:
        self.bodies: list[dict] = []
        app = Starlette(
            routes=[
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
            ]
        )
        self.models_listed = models
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model"} for name in self.models_listed]}
        )

    async def chat(self, request: Request) -> StreamingResponse:
        body = await request.json()
        self.bodies.append(body)
        return StreamingResponse(self._events(body["max_tokens"]), media_type="text/event-stream")

    async def _events(self, max_tokens: int) -> AsyncIterator[bytes]:
        yield _event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for index in range(max_tokens):
            await asyncio.sleep(0)
            yield _event({"choices": [{"index": 0, "delta": {"content": f"t{index} "}}]})
        yield _event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": max_tokens}})
        yield b"data:[DONE]\r\n\r\n"

    def __enter__(self) -> OpenAIStyleServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "the server did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(15)
        self._sock.close()


def _event(payload: dict) -> bytes:
    return f"data:{json.dumps(payload)}\r\n\r\n".encode()


@pytest.fixture
def server() -> Iterator[OpenAIStyleServer]:
    with OpenAIStyleServer(["served-model", "other-model"]) as running:
        yield running


def serving(base_url: str, out: Path, *extra: str) -> int:
    argv = ["bench", "serving", "--base-url", base_url, "--concurrency", "1,2", "--max-tokens", "4"]
    return main([*argv, "--level-timeout", "30", "--out", str(out), *extra])


def test_base_url_sweeps_any_openai_server_with_the_first_listed_model_and_no_stack(server, tmp_path):
    assert serving(f"{server.base_url}/v1/", tmp_path, "--requests-per-stream", "3") == 0
    report = json.loads((tmp_path / "serving.json").read_text())
    assert report["settings"]["base_url"] == server.base_url and report["settings"]["model"] == "served-model"
    (run,) = report["modes"]
    assert run["mode"] is None
    assert [(lv["concurrency"], lv["requests"], lv["ok"]) for lv in run["sweep"]] == [(1, 3, 3), (2, 6, 6)]
    assert all(lv["itl_ms"]["n"] == lv["ok"] * 3 for lv in run["sweep"]), "4 text chunks: 3 gaps a request"
    assert report["comparison"] is None and report["scaling"] == [] and report["total_errors"] == 0
    assert {path.name for path in tmp_path.iterdir()} == {"serving.json", "serving.md", "serving.png"}, "no stack logs"
    assert len(server.bodies) == 2 + 3 + 6, "two warm-up requests, then the levels"
    assert {body["model"] for body in server.bodies} == {"served-model"}
    assert not any("ignore_eos" in body for body in server.bodies), "only --ignore-eos sends it"
    assert f"## Concurrency sweep, {server.base_url}" in (tmp_path / "serving.md").read_text()


def test_base_url_sends_ignore_eos_and_the_named_model_when_asked(server, tmp_path):
    assert serving(server.base_url, tmp_path, "--model", "mine", "--ignore-eos", "--requests-per-level", "2") == 0
    assert {body["model"] for body in server.bodies} == {"mine"}
    assert all(body["ignore_eos"] is True and body["stream"] is True for body in server.bodies)
    report = json.loads((tmp_path / "serving.json").read_text())
    assert [lv["requests"] for lv in report["modes"][0]["sweep"]] == [2, 2]


def unused_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--speculation", "none,mtp"], "--speculation=none,mtp is for the stack"),
        (["--requests-per-level", "2", "--requests-per-stream", "2"], "choose one"),
        (["--requests-per-stream", "0"], "--requests-per-stream=0"),
    ],
)
def test_bad_flags_with_base_url_are_one_line_errors(server, tmp_path, capsys, extra, message):
    assert serving(server.base_url, tmp_path, *extra) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("arbor: error: ") and message in line
    assert server.bodies == []


def test_an_unreachable_url_or_a_server_without_models_is_a_one_line_error(tmp_path, capsys):
    url = f"http://127.0.0.1:{unused_port()}"
    assert serving(url, tmp_path) == 2
    err = capsys.readouterr().err
    assert f"arbor: error: --base-url={url}: GET {url}/v1/models failed" in err and "Traceback" not in err
    with OpenAIStyleServer([]) as empty:
        assert serving(empty.base_url, tmp_path) == 2
        assert "lists no models: pass --model" in capsys.readouterr().err.splitlines()[-1]
        assert empty.bodies == []
    assert serving("https://example.invalid", tmp_path) == 2
    assert "must be http://host[:port]" in capsys.readouterr().err


def test_each_apis_level_is_compared_with_the_chat_level_run_beside_it() -> None:
    from ops.bench.api_compare import apis_markdown

    def level(rate: float) -> dict:
        return {"concurrency": 16, "errors": 0, "ok": 4, "output_tokens_per_s": rate, "ttft_ms": {}, "itl_ms": {}}

    table = "\n".join(apis_markdown({"chat": [level(100.0), level(200.0)], "messages": [level(110.0), level(180.0)]}))
    assert "| messages | 16 | 0 | 110.0 | 1.100x |" in table  # against the first chat level, not the last
    assert "| messages | 16 | 0 | 180.0 | 0.900x |" in table
