"""`arbor bench owner`: what a worker adds per token beyond the model, measured in one process.

Request by request, alternating, the same prompt goes through two loops on the same model:

  generate   `arbor generate`'s loop: runner.decode_step + the detokenizer (the in-process side
             of `arbor bench serving`'s gateway-vs-in-process comparison);
  owner      the worker's owner thread: scheduler, lane output, events and the publisher writing
             them to a real embedded Redis, to which a listener process is subscribed (so every
             PUBLISH is heard, as the gateway's would be).

The headline is the paired ratio: generate's wall time per token over the owner's, request by
request (each owner request against the generate request run next to it, so the VM's drift,
which moves whole minutes by up to 30%, cancels within a pair), its median and a 95% bootstrap
interval. It is the most the gateway path can reach against in-process generate: the gateway,
Redis and the client only add to the owner's work. `arbor bench serving` measures the whole path
(docs/BENCHMARKS.md, "Gateway overhead on the tiny model"); this isolates the worker, with less
noise.

Also per loop: the model's own time per token (the sequence's prefill_s + decode_s, clocked in
the runner) and the rest of the wall time. The split says where the time goes, with a caveat
measured on the tiny model: work between steps slows the model's step itself (a step after the
detokenizer, or after a publish, finds colder caches), so the model's time differs between the
loops too, and the paired ratio, not the non-model time, is the figure to trust.

Each loop's CPU time per token is reported too (its thread's own clock). With `--free-model` the
model's decode step is replaced by one that emits the prompt's tokens again at no cost (the KV
cache still advances): what is left is each loop's own work, with warm caches and little noise,
the way to measure a change to the owner's per-step code (run the old and the new tree in turn).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from ops.bench.results import machine_info, markdown_table, median_with_interval, results_dir, write_json
from ops.launch.embedded_redis import EmbeddedRedis
from shared import keys
from shared.protocol import JobState
from shared.sampling import SamplingParams

STREAM = "bench-owner"
WORKER_ID = "bench-owner"
MAX_PREFILL_CHUNK = 512
LISTENER = """
import sys, redis
pubsub = redis.Redis.from_url(sys.argv[1]).pubsub()
pubsub.psubscribe(sys.argv[2])
for _ in pubsub.listen():
    pass
"""


class _FreeModel:
    """Within the block, the runner's decode step costs nothing: it emits the prompt's tokens again,
    one a step, advances the KV cache by one slot and ends the sequence at max_tokens."""

    def __init__(self, runner, enabled: bool):
        self._runner = runner
        self._enabled = enabled

    def __enter__(self) -> _FreeModel:
        if self._enabled:
            self._runner.decode_step = _free_decode_step  # an instance attribute: the class is untouched
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._enabled:
            del self._runner.decode_step


def _free_decode_step(sequence) -> list[int]:
    token = sequence.prompt_ids[len(sequence.output_ids) % len(sequence.prompt_ids)]
    sequence.cache.commit(1)
    sequence.output_ids.append(token)
    if len(sequence.output_ids) >= sequence.params.max_tokens:
        sequence.finish_reason = "length"
    sequence.stats.record_step(0, 0, 1)
    return [token]


def run_owner_command(args: argparse.Namespace) -> int:
    wrong = [
        f"--{flag}={value} must be at least {least}"
        for flag, value, least in (
            ("requests", args.requests, 1),
            ("max-tokens", args.max_tokens, 2),
            ("publish-interval-ms", args.publish_interval_ms, 0),
            ("publish-budget", args.publish_budget, 0),
        )
        if value < least
    ]
    if wrong:
        raise ValueError("; ".join(wrong))
    folder = results_dir(args.out)
    report = run_owner_bench(
        args.model,
        args.requests,
        args.max_tokens,
        args.publish_interval_ms / 1000,
        args.threads,
        args.dtype,
        args.free_model,
        args.publish_budget,
    )
    write_json(folder / "owner.json", report)
    text = owner_markdown(report)
    (folder / "owner.md").write_text(text)
    print(text)
    print(f"results: {folder}")
    return 0


def run_owner_bench(
    model: str | None,
    requests: int,
    max_tokens: int,
    publish_interval_s: float,
    threads: int | None,
    dtype: str,
    free_model: bool = False,
    publish_budget: float = 0.0,
) -> dict:
    from ops.bench.decode import encode_prompt  # torch from here on
    from ops.training.prompts import HELD_OUT
    from worker.serving_model import load_serving_model

    served = load_serving_model(model, "none", None, dtype, num_threads=threads)
    prompts = [encode_prompt(served, HELD_OUT[i % len(HELD_OUT)]) for i in range(requests)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for prompt in prompts:  # a one-line error now, not a failed lane later
        served.runner.check_fits(len(prompt), max_tokens)
    with (
        EmbeddedRedis() as server,
        _Listener(server.url),
        _FreeModel(served.runner, free_model),
        _OwnerLoop(served, server.url, publish_interval_s, publish_budget) as owner,
    ):
        contenders: dict[str, Callable] = {"generate": _generate_loop(served), "owner": owner.run_request}
        for run in contenders.values():  # warm-up, not counted
            run(prompts[0], params)
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in contenders}
        for index, prompt in enumerate(prompts):
            order = list(contenders) if index % 2 == 0 else list(reversed(contenders))
            for name in order:
                samples[name].append(contenders[name](prompt, params))
    rows = {name: _summary(values, max_tokens) for name, values in samples.items()}
    paired = [generate[0] / owner[0] for generate, owner in zip(samples["generate"], samples["owner"], strict=True)]
    return {
        "benchmark": "owner",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine_info(),
        "settings": {
            "model": served.name,
            "dtype": dtype,
            "threads": threads or "torch default",
            "requests": requests,
            "max_tokens": max_tokens,
            "free_model": free_model,
            "publish_interval_ms": round(publish_interval_s * 1000, 3),
            "publish_budget": publish_budget,
        },
        "contenders": rows,
        "paired_ratio": median_with_interval(paired),
    }


def _summary(samples: list[tuple[float, float, float]], max_tokens: int) -> dict:
    """Medians over requests, per token: wall time, the model's time, the rest, the loop thread's CPU."""

    def per_token_us(values) -> float:
        return round(statistics.median(value / max_tokens for value in values) * 1e6, 1)

    return {
        "requests": len(samples),
        "wall_us_per_token": per_token_us(wall for wall, _, _ in samples),
        "model_us_per_token": per_token_us(model for _, model, _ in samples),
        "non_model_us_per_token": per_token_us(wall - model for wall, model, _ in samples),
        "cpu_us_per_token": per_token_us(cpu for _, _, cpu in samples),
    }


def owner_markdown(report: dict) -> str:
    settings = report["settings"]
    rows = [
        [
            name,
            str(row["requests"]),
            f"{row['wall_us_per_token']:.1f}",
            f"{row['model_us_per_token']:.1f}",
            f"{row['non_model_us_per_token']:.1f}",
            f"{row['cpu_us_per_token']:.1f}",
        ]
        for name, row in report["contenders"].items()
    ]
    paired = report["paired_ratio"]
    return "\n".join(
        [
            f"# arbor bench owner — {report['timestamp']}",
            "",
            f"Model {settings['model']}, {settings['dtype']}, "
            f"{settings['max_tokens']} tokens per request (EOS ignored), "
            f"greedy, torch threads: {settings['threads']}, publish interval {settings['publish_interval_ms']:g} ms "
            f"(budget {settings.get('publish_budget', 0):g}); "
            f"the two loops alternate request by request."
            + (
                " **Free model**: the decode step costs nothing; what is left is each loop's own work."
                if settings["free_model"]
                else ""
            ),
            "",
            markdown_table(
                ["loop", "requests", "wall µs/token", "model µs/token", "rest µs/token", "CPU µs/token"], rows
            ),
            "",
            f"Generate's wall time per token over the owner's, request by request: median **{paired['median']:.3f}**, "
            f"95% interval of the median {paired['ci95'][0]:.3f}-{paired['ci95'][1]:.3f} ({paired['pairs']} pairs). "
            "The gateway path cannot beat this against in-process generate: the gateway, Redis and the client "
            "only add to it. Medians in µs per token; the model's time is the runner's own clock, the CPU time "
            "the loop's thread's.",
            "",
        ]
    )


def _generate_loop(served) -> Callable[[list[int], SamplingParams], tuple[float, float, float]]:
    from worker.engine.generate import generate

    def run(prompt: list[int], params: SamplingParams) -> tuple[float, float, float]:
        started, cpu_started = time.perf_counter(), time.thread_time()
        stats = generate(served.runner, served.tokenizer, prompt, params, request_id="bench").stats
        return time.perf_counter() - started, stats.prefill_s + stats.decode_s, time.thread_time() - cpu_started

    return run


class _Listener:
    """A process subscribed to every request's events: each PUBLISH wakes a reader, as in serving."""

    def __init__(self, url: str):
        self._argv = [sys.executable, "-c", LISTENER, url, keys.events_channel("*")]
        self._process: subprocess.Popen | None = None

    def __enter__(self) -> _Listener:
        import redis

        self._process = subprocess.Popen(self._argv)
        client = redis.Redis.from_url(self._argv[3])
        deadline = time.monotonic() + 30
        while not client.pubsub_numpat() and time.monotonic() < deadline:
            time.sleep(0.01)
        client.close()
        return self

    def __exit__(self, *exc_info: object) -> None:
        assert self._process is not None
        self._process.kill()
        self._process.wait()


class _OwnerLoop:
    """The worker's owner thread over the model, publishing to Redis; one request at a time."""

    def __init__(self, served, url: str, publish_interval_s: float, publish_budget: float):
        import redis

        from worker.redis_side.publisher import Publisher
        from worker.serving.model_stepper import ModelStepper
        from worker.serving.owner import Capacity, Owner, OwnerConfig

        self._redis = redis.Redis.from_url(url)
        self._redis.xgroup_create(STREAM, keys.CONSUMER_GROUP, "0", mkstream=True)
        self._done = threading.Event()
        self._fenced: str | None = None
        publisher = Publisher(
            redis.ConnectionPool.from_url(url),
            WORKER_ID,
            STREAM,
            reply_timeout_s=5.0,
            on_lost=self._lost,
            on_done=lambda ref: self._done.set(),
            publish_interval_s=publish_interval_s,
            publish_budget=publish_budget,
        )
        self.capacity = Capacity(max_lanes=1)
        config = OwnerConfig(WORKER_ID, "none", 1, max_kv_bytes=1 << 40, max_batch_tokens=MAX_PREFILL_CHUNK)
        self.owner = Owner(ModelStepper(served.runner), served.tokenizer, config, self.capacity, publisher)
        self._last_sequence = None
        runner_start = served.runner.start

        def start(*args, **kwargs):  # keeps the lane's sequence: its stats hold the model's own time
            self._last_sequence = runner_start(*args, **kwargs)
            return self._last_sequence

        self._runner = served.runner
        served.runner.start = start  # an instance attribute: the class is untouched
        self._thread = threading.Thread(target=self.owner.run, name="arbor-owner", daemon=True)
        self._count = 0

    def __enter__(self) -> _OwnerLoop:
        self._thread.start()
        assert self._thread.ident is not None  # set by start()
        self._cpu_clock = time.pthread_getcpuclockid(self._thread.ident)
        return self

    def __exit__(self, *exc_info: object) -> None:
        from worker.serving.owner import StopOwner

        self.owner.inbox.put(StopOwner())
        self._thread.join(30)
        del self._runner.start  # the instance attribute goes: the class's method is back
        self._redis.close()

    def _lost(self, request_id: str) -> None:  # on the owner thread: note it, and end the wait
        self._fenced = request_id
        self._done.set()

    def run_request(self, prompt: list[int], params: SamplingParams) -> tuple[float, float, float]:
        from worker.serving.handoff import JobRef, JobSpec
        from worker.serving.lane_output import OutputOptions
        from worker.serving.owner import StartJob

        self._count += 1
        request_id = f"bench-{self._count}"
        self._redis.xadd(STREAM, {"id": request_id})  # read as this worker's, so its publishing is not fenced
        reply = self._redis.xreadgroup(keys.CONSUMER_GROUP, WORKER_ID, {STREAM: ">"}, count=1)
        assert isinstance(reply, list)  # RESP2: [[stream, [(entry id, fields)]]]
        ((_, [(entry_id, _)]),) = reply
        entry_id = entry_id.decode()
        now = time.time()
        spec = JobSpec(
            request_id,
            entry_id,
            1,
            "chat",
            now,
            now + 600,
            prompt,
            params,
            1,
            OutputOptions(),
            JobState(worker=WORKER_ID, attempt=1),
        )
        self._done.clear()
        self.capacity.hold(1)
        started, cpu_started = time.perf_counter(), time.clock_gettime(self._cpu_clock)
        self.owner.inbox.put(StartJob(spec, JobRef(request_id, STREAM, entry_id, 1)))
        if not self._done.wait(600) or self._fenced is not None:
            raise RuntimeError(f"bench owner: {request_id} did not finish (fenced: {self._fenced})")
        wall, cpu = time.perf_counter() - started, time.clock_gettime(self._cpu_clock) - cpu_started
        assert self._last_sequence is not None  # the request's lane started
        stats = self._last_sequence.stats
        return wall, stats.prefill_s + stats.decode_s, cpu
