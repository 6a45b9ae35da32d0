"""`arbor bench failover` (or `python -m ops.bench.failover`): the stack on a Redis Sentinel set,
through N failovers.

    Sentinel set on loopback (ops/launch/sentinel_set.py: 1 master, 2 replicas, 3 sentinels,
    min-replicas-to-write 1, down-after 1000 ms)
    arbor up --workers W (REDIS_URL=redis+sentinel://..., ARBOR_REDIS_MIN_REPLICAS=1)
    per round: S greedy streams; once text flows on all, the master gets SIGKILL (and is
    started again as a replica) or, with --kind sigstop or mixed, is frozen until another is
    promoted and then resumed

What it reports, per kind of failover and overall:
- the write gap: the longest run of failing confirmed writes (RPUSH + WAIT 1 every 20 ms through
  the same Sentinel URL) around each failover;
- TTFT and inter-token latency p50/p99/max of the streams that crossed a failover;
- tokens lost and duplicated: each stream's tokens (from streamed logprobs) aligned against the
  same request run uninterrupted first (difflib): a deletion is lost, an insertion duplicated,
  a replacement both. Goal: 0 and 0.

Writes `failover.json` and prints a markdown table. A small run: `--failovers 2 --streams 4`.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ops.launch.sentinel_set import Node, SentinelSet, wait_for
from shared.redis_connect import sync_client

READY_LINE = "Arbor is up at"
START_TIMEOUT_S = 600.0
STREAM_TIMEOUT_S = 600.0


@dataclass
class StreamRecord:
    tokens: list[str] = field(default_factory=list)
    started: float = 0.0
    token_times: list[float] = field(default_factory=list)
    status: int | None = None
    error: str | None = None
    finish_reason: str | None = None


class Stream(threading.Thread):
    """One streaming chat request with logprobs (its tokens, one by one, with their times)."""

    def __init__(self, base_url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base_url, self.body, self.record = base_url, body | {"stream": True, "logprobs": True}, StreamRecord()

    def run(self) -> None:
        record = self.record
        record.started = time.monotonic()
        try:
            with httpx.stream(
                "POST", f"{self.base_url}/v1/chat/completions", json=self.body, timeout=STREAM_TIMEOUT_S
            ) as response:
                record.status = response.status_code
                for line in response.iter_lines():
                    self._take(line)
        except httpx.HTTPError as error:
            record.error = repr(error)

    def _take(self, line: str) -> None:
        if not line.startswith("data: ") or line == "data: [DONE]":
            return
        data = json.loads(line.removeprefix("data: "))
        if "error" in data:
            self.record.error = data["error"].get("code")
            return
        for choice in data["choices"]:
            for item in (choice.get("logprobs") or {}).get("content") or []:
                self.record.tokens.append(item["token"])
                self.record.token_times.append(time.monotonic())
            self.record.finish_reason = choice.get("finish_reason") or self.record.finish_reason


class GapProbe(threading.Thread):
    """Confirmed writes every 20 ms; the longest run of failures while it ran."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self._client = sync_client(url, 1.0)
        self._stopping = threading.Event()
        self.longest_gap_s = 0.0

    def run(self) -> None:
        failing_since: float | None = None
        while not self._stopping.is_set():
            now = time.monotonic()
            if self._confirmed():
                if failing_since is not None:
                    self.longest_gap_s = max(self.longest_gap_s, now - failing_since)
                failing_since = None
            else:
                failing_since = failing_since or now
            time.sleep(0.02)

    def _confirmed(self) -> bool:
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.rpush("arbor:bench:probe", 1)
                pipe.ltrim("arbor:bench:probe", -10, -1)
                pipe.wait(1, 500)
                return bool(pipe.execute()[-1] >= 1)
        except Exception:  # any failure is part of the gap
            return False

    def stop(self) -> float:
        self._stopping.set()
        self.join(10)
        self._client.close()
        return self.longest_gap_s


def token_errors(reference: list[str], streamed: list[str]) -> tuple[int, int]:
    """(lost, duplicated): what aligning the streamed tokens on the reference leaves over."""
    lost = duplicated = 0
    for op, ref_from, ref_to, got_from, got_to in difflib.SequenceMatcher(None, reference, streamed).get_opcodes():
        if op in ("delete", "replace"):
            lost += ref_to - ref_from
        if op in ("insert", "replace"):
            duplicated += got_to - got_from
    return lost, duplicated


def disrupt(cluster: SentinelSet, kind: str) -> Callable[[], None]:
    """Start a failover of `kind`; returns what waits for it to be over."""
    if kind == "sigkill":
        old = cluster.kill_master()

        def recover_killed() -> None:
            cluster.wait_for_new_master(old)
            cluster.restart(old)

        return recover_killed
    frozen: Node = cluster.master()
    assert frozen.process is not None
    os.kill(frozen.process.pid, signal.SIGSTOP)

    def recover_frozen() -> None:
        try:
            cluster.wait_for_new_master(frozen)
        finally:
            if frozen.process is not None:
                os.kill(frozen.process.pid, signal.SIGCONT)

    return recover_frozen


def bodies(args: argparse.Namespace) -> list[dict]:
    return [
        {
            "model": args.served_name,
            "messages": [{"role": "user", "content": f"Story {number}: a river crosses a kingdom."}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }
        for number in range(args.streams)
    ]


def run_streams(base_url: str, requests: list[dict], during: Callable[[], dict] | None = None) -> tuple[list, dict]:
    streams = [Stream(base_url, body) for body in requests]
    for stream in streams:
        stream.start()
    extra: dict = {}
    if during is not None:
        wait_for(lambda: all(len(s.record.tokens) >= 2 for s in streams), STREAM_TIMEOUT_S, "tokens on every stream")
        extra = during()
    for stream in streams:
        stream.join(STREAM_TIMEOUT_S)
    return [stream.record for stream in streams], extra


def percentiles_ms(values_s: list[float]) -> dict:
    """p50, p99 (nearest rank) and max, in ms."""
    if not values_s:
        return {}
    ordered = sorted(value * 1000 for value in values_s)

    def rank(fraction: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]

    return {"p50": rank(0.50), "p99": rank(0.99), "max": ordered[-1]}


def summarize(rounds: list[dict]) -> dict:
    summary = {}
    for kind in sorted({r["kind"] for r in rounds}) + ["all"]:
        chosen = [r for r in rounds if kind in ("all", r["kind"])]
        summary[kind] = {
            "failovers": len(chosen),
            "write_gap_s": {
                "mean": sum(r["write_gap_s"] for r in chosen) / len(chosen),
                "max": max(r["write_gap_s"] for r in chosen),
            },
            "ttft_ms": percentiles_ms([t for r in chosen for t in r["ttft_s"]]),
            "itl_ms": percentiles_ms([t for r in chosen for t in r["itl_s"]]),
            "tokens_lost": sum(r["tokens_lost"] for r in chosen),
            "tokens_duplicated": sum(r["tokens_duplicated"] for r in chosen),
            "failed_streams": sum(r["failed_streams"] for r in chosen),
        }
    return summary


def one_round(base_url: str, cluster: SentinelSet, args: argparse.Namespace, kind: str, reference: list) -> dict:
    def failover() -> dict:
        probe = GapProbe(cluster.url)
        probe.start()
        disrupt(cluster, kind)()
        time.sleep(1.0)  # the probe sees writes flow again
        return {"write_gap_s": probe.stop()}

    records, extra = run_streams(base_url, bodies(args), failover)
    cluster.wait_for_replicas(2)
    errors = [token_errors(ref, rec.tokens) for ref, rec in zip(reference, records, strict=True)]
    return {
        "kind": kind,
        "write_gap_s": extra["write_gap_s"],
        "ttft_s": [rec.token_times[0] - rec.started for rec in records if rec.token_times],
        "itl_s": [b - a for rec in records for a, b in zip(rec.token_times, rec.token_times[1:], strict=False)],
        "tokens_lost": sum(lost for lost, _ in errors),
        "tokens_duplicated": sum(dup for _, dup in errors),
        "failed_streams": sum(rec.status != 200 or rec.error is not None or not rec.finish_reason for rec in records),
    }


def start_stack(cluster: SentinelSet, args: argparse.Namespace, workdir: Path) -> tuple[subprocess.Popen, str, Path]:
    port = args.port
    env = dict(os.environ) | {
        "REDIS_URL": cluster.url,
        "ARBOR_REDIS_MIN_REPLICAS": "1",
        "ARBOR_PREFILL_CACHE_BYTES": "0",  # every run computes the same thing: comparable tokens
        "XDG_RUNTIME_DIR": str(workdir / "run"),
    }
    argv = ["up", "--port", str(port), "--workers", str(args.workers), "--speculation", args.speculation]
    argv += ["--model", args.model] if args.model else []
    log = workdir / "up.log"
    with log.open("wb") as sink:
        process = subprocess.Popen([sys.executable, "-m", "ops.cli", *argv], env=env, stdout=sink, stderr=sink)
    wait_for(lambda: READY_LINE in log.read_text(errors="replace") or process.poll() is not None, START_TIMEOUT_S, "up")
    if process.poll() is not None:
        raise RuntimeError(f"arbor up exited: {log.read_text(errors='replace')[-2000:]}")
    return process, f"http://127.0.0.1:{port}", log


def kinds(args: argparse.Namespace) -> list[str]:
    if args.kind == "mixed":
        return ["sigkill" if number % 2 == 0 else "sigstop" for number in range(args.failovers)]
    return [args.kind] * args.failovers


def run(args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="arbor-failover-"))
    with SentinelSet(down_after_ms=args.down_after_ms) as cluster:
        process, base_url, log = start_stack(cluster, args, workdir)
        try:
            reference_records, _ = run_streams(base_url, bodies(args))
            reference = [record.tokens for record in reference_records]
            rounds = []
            for number, kind in enumerate(kinds(args), 1):
                rounds.append(one_round(base_url, cluster, args, kind, reference))
                print(f"failover {number}/{args.failovers} ({kind}): {json.dumps(_short(rounds[-1]))}", flush=True)
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(120)
            except subprocess.TimeoutExpired:
                process.kill()
    return {"config": vars(args), "summary": summarize(rounds), "rounds": rounds}


def _short(round_: dict) -> dict:
    return {key: round_[key] for key in ("write_gap_s", "tokens_lost", "tokens_duplicated", "failed_streams")}


def markdown(summary: dict) -> str:
    rows = [
        "| failovers | kind | write gap mean / max (s) | TTFT p50 / p99 (ms) | ITL p50 / p99 / max (ms) "
        "| tokens lost | duplicated | failed streams |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for kind, row in summary.items():
        gap, ttft, itl = row["write_gap_s"], row["ttft_ms"], row["itl_ms"]
        rows.append(
            f"| {row['failovers']} | {kind} | {gap.get('mean', 0):.2f} / {gap.get('max', 0):.2f} "
            f"| {ttft.get('p50', 0):.0f} / {ttft.get('p99', 0):.0f} "
            f"| {itl.get('p50', 0):.1f} / {itl.get('p99', 0):.1f} / {itl.get('max', 0):.0f} "
            f"| {row['tokens_lost']} | {row['tokens_duplicated']} | {row['failed_streams']} |"
        )
    return "\n".join(rows)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--failovers", type=int, default=20)
    parser.add_argument("--kind", choices=["sigkill", "sigstop", "mixed"], default="mixed")
    parser.add_argument("--streams", type=int, default=16, help="streaming requests in flight at each failover")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--served-name", default="SmolLM2-135M-Instruct", help="the model name clients send")
    parser.add_argument("--speculation", default="none")
    parser.add_argument("--down-after-ms", type=int, default=1000, help="sentinels' down-after-milliseconds")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--out", type=Path, default=Path("failover.json"))


def run_from_args(args: argparse.Namespace) -> int:
    result = run(args)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(markdown(result["summary"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.failover", description="the stack through failovers")
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
