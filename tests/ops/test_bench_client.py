"""The benchmark's own HTTP/1.1 client: chunked SSE and plain error bodies, connections reused."""

from __future__ import annotations

import asyncio
import json
import socketserver
import threading
import time

from ops.bench.client import SseClient, chat_body, stream_chat


def sse(payload: dict | str) -> bytes:
    data = payload if isinstance(payload, str) else json.dumps(payload)
    return f"data: {data}\n\n".encode()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


STREAM = [
    sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
    sse({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    + sse({"choices": [{"index": 0, "delta": {"content": "lo"}}]})[:9],  # an event split across chunks
    sse({"choices": [{"index": 0, "delta": {"content": "lo"}}]})[9:],
    sse({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}) + sse("[DONE]"),
]


async def serve(connections: list[int], requests: list[bytes]) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await answer(reader, writer)
        finally:  # also when the loop ends first and cancels this
            writer.close()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(
                next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
            )
            body = json.loads(await reader.readexactly(length))
            requests.append(head.split(b"\r\n")[0])
            if body["model"] == "missing":
                error = json.dumps({"error": {"message": "no such model", "code": "model_not_found"}}).encode()
                writer.write(
                    b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(error)}\r\n\r\n".encode()
                    + error
                )
                continue
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in STREAM:
                writer.write(chunk(part))
                await writer.drain()
                await asyncio.sleep(0.001)
            writer.write(b"0\r\n\r\n")

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_streams_sse_over_chunks_and_reads_errors_on_one_kept_alive_connection() -> None:
    async def main() -> None:
        connections: list[int] = []
        requests: list[bytes] = []
        server = await serve(connections, requests)
        port = server.sockets[0].getsockname()[1]
        client = SseClient(f"http://127.0.0.1:{port}", timeout_s=10)
        try:
            ok = await stream_chat(client, chat_body("tiny", "hi", 2, 0.0))
            missing = await stream_chat(client, chat_body("missing", "hi", 2, 0.0))
            again = await stream_chat(client, chat_body("tiny", "hi", 2, 0.0))
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()
        for record in (ok, again):
            assert record.ok and record.error is None
            assert record.completion_tokens == 2
            assert record.ttft_s is not None and len(record.chunk_gaps_s) == 1, "two text chunks: Hel, lo"
            assert record.e2e_s >= record.ttft_s
        assert not missing.ok and missing.error.startswith("HTTP 404:") and "no such model" in missing.error
        assert requests == [b"POST /v1/chat/completions HTTP/1.1"] * 3
        assert len(connections) == 1, "the connection is reused after a full body, error bodies included"

    asyncio.run(main())


def test_a_server_that_hangs_up_mid_stream_is_an_error_not_a_hang() -> None:
    async def main() -> None:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunk(STREAM[0]))
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = SseClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", timeout_s=10)
        try:
            record = await stream_chat(client, chat_body("tiny", "hi", 2, 0.0))
        finally:
            await client.aclose()
            server.close()
            await server.wait_closed()
        assert not record.ok and record.error and "IncompleteReadError" in record.error

    asyncio.run(main())


def test_a_connection_idle_past_the_keep_alive_is_not_reused() -> None:
    """uvicorn closes a connection idle for 5 s; a request written to it then is lost. Here a server
    on its own thread closes one idle for 0.3 s while the client's loop is blocked (as during an
    in-process request) and does not see it; the client keeps connections for 0.1 s."""

    class Handler(socketserver.StreamRequestHandler):
        timeout = 0.3  # idle this long: hang up, as uvicorn does

        def handle(self) -> None:
            connections.append(1)
            try:
                while self.rfile.readline():
                    length = 0
                    while (line := self.rfile.readline()) not in (b"\r\n", b""):
                        if line.lower().startswith(b"content-length"):
                            length = int(line.split(b":")[1])
                    self.rfile.read(length)
                    self.wfile.write(
                        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                        + b"".join(chunk(part) for part in STREAM)
                        + b"0\r\n\r\n"
                    )
            except TimeoutError:
                pass

    connections: list[int] = []
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def main() -> list:
        kept = SseClient(f"http://127.0.0.1:{port}", timeout_s=10, keep_alive_s=0.1)
        stale = SseClient(f"http://127.0.0.1:{port}", timeout_s=10, keep_alive_s=60)
        records = []
        try:
            for client in (kept, stale):
                records.append(await stream_chat(client, chat_body("tiny", "hi", 2, 0.0)))
                time.sleep(0.6)  # blocks the loop: the hang-up is not seen
                records.append(await stream_chat(client, chat_body("tiny", "hi", 2, 0.0)))
        finally:
            await kept.aclose()
            await stale.aclose()
        return records

    try:
        records = asyncio.run(main())
    finally:
        server.shutdown()
        server.server_close()
    assert [record.ok for record in records[:2]] == [True, True]
    # the stale client wrote to the connection the server had closed: nothing came back, so the
    # request went again on a fresh connection (llama-server closes after each reply, unannounced)
    assert records[3].ok, records[3].error
    assert len(connections) == 4
