"""Self-distilled drafter data through Arbor's batched serving engine, in shards, resumable.

The target answers the prompt mix (prompt_mix.py) through the same scheduler, stepper and block
pool the worker serves with (many lanes per step, prefill chunks sharing steps with decode rows),
in process. The mix is cut into fixed shards of `shard_size` prompts, in the mix's order; a shard
is written (atomically: a temporary file, then a rename) once all its prompts are answered, and a
run skips the shards already on disk, so a killed run loses at most the shards it had started.
A lane's tokens do not depend on the lanes beside it (greedy, and seeded sampling: the batched
engine's tested promise), so a resumed run writes the tokens an uninterrupted one would have.

Shard `shard-00012.npz`: token_ids uint16 (every sequence's prompt + answer, concatenated),
offsets int64 [n + 1], prompt_lengths int32 [n], keys (the prompts' keys). Token ids only:
the trainer recomputes the target's hidden states in batched prefill.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ops.training.prompt_mix import MixPrompt
from shared.sampling import SamplingParams

MAX_UINT16_VOCAB = 1 << 16
MANIFEST = "mix.json"
MAX_LANE_TOKENS = 1536  # prompt + answer: the pool is sized for this many tokens a lane, not the whole context


@dataclass(slots=True)
class EngineRunStats:
    generated_keys: list[str] = field(default_factory=list)  # prompts answered by this run
    skipped_shards: int = 0
    written_shards: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    elapsed_s: float = 0.0
    cpu_s: float = 0.0  # this process's CPU time: on a shared machine, what the generation itself took

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.elapsed_s if self.elapsed_s else 0.0


def shard_path(folder: Path, index: int) -> Path:
    return folder / f"shard-{index:05d}.npz"


def generate_shards(
    served,
    prompts: list[MixPrompt],
    folder: Path,
    max_new_tokens: int,
    shard_size: int = 128,
    max_lanes: int = 16,
    max_batch_tokens: int = 256,
    progress: Callable[[EngineRunStats], None] | None = None,
    part: tuple[int, int] = (0, 1),
) -> EngineRunStats:
    """Answer every prompt whose shard is not on disk yet; write each shard as it completes.
    part (i, n): only the shards whose index is i modulo n, so that n processes (one a core) share a
    folder without answering a prompt twice."""
    assert served.loaded.config.vocab_size <= MAX_UINT16_VOCAB, "token ids are stored as uint16"
    folder.mkdir(parents=True, exist_ok=True)
    _check_manifest(folder, {"shard_size": shard_size, "max_new_tokens": max_new_tokens})
    shards = [prompts[start : start + shard_size] for start in range(0, len(prompts), shard_size)]
    which, parts = part
    mine = [index for index in range(len(shards)) if index % parts == which]
    todo = [index for index in mine if not _done(folder, index, shards[index])]
    stats = EngineRunStats(skipped_shards=len(mine) - len(todo))
    started, cpu_started = time.perf_counter(), time.process_time()
    engine = _Engine(served, max_new_tokens, max_lanes, max_batch_tokens)
    done: dict[str, list[int]] = {}
    lengths: dict[str, int] = {}
    queue = [(index, prompt) for index in todo for prompt in shards[index]]
    remaining = {index: len(shards[index]) for index in todo}
    shard_of = {prompt.key: index for index, prompt in queue}
    for key, prompt_ids, output_ids in engine.run(queue):
        done[key], lengths[key] = prompt_ids + output_ids, len(prompt_ids)
        stats.generated_keys.append(key)
        stats.prompt_tokens += len(prompt_ids)
        stats.generated_tokens += len(output_ids)
        index = shard_of[key]
        remaining[index] -= 1
        if remaining[index] == 0:
            keys = [prompt.key for prompt in shards[index]]
            write_shard(shard_path(folder, index), keys, [done.pop(k) for k in keys], [lengths.pop(k) for k in keys])
            stats.written_shards += 1
            stats.elapsed_s, stats.cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
            if progress is not None:
                progress(stats)
    stats.elapsed_s, stats.cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    return stats


def _done(folder: Path, index: int, shard: list[MixPrompt]) -> bool:
    """The shard is on disk, holding these very prompts (another mix in the folder would mix data sets)."""
    path = shard_path(folder, index)
    if not path.exists():
        return False
    with np.load(path) as saved:
        keys = saved["keys"].tolist()
    if keys != [prompt.key for prompt in shard]:
        raise ValueError(f"{path} holds other prompts than this mix's shard {index}: use another folder")
    return True


def _check_manifest(folder: Path, settings: dict) -> None:
    """Shards made with other settings would mix two data sets: refuse, naming the setting."""
    path = folder / MANIFEST
    if not path.exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # processes sharing the folder
        partial.write_text(json.dumps(settings) + "\n")
        partial.replace(path)
        return
    saved = json.loads(path.read_text())
    for name, value in settings.items():
        if saved.get(name) != value:
            raise ValueError(f"{folder}: its shards were made with {name}={saved.get(name)}, not {value}")


class _Engine:
    """The worker's batched path in process: Scheduler + ModelStepper + a block pool."""

    def __init__(self, served, max_new_tokens: int, max_lanes: int, max_batch_tokens: int):
        from worker.models.pool_factory import new_pool
        from worker.serving.model_stepper import ModelStepper
        from worker.serving.scheduler import Scheduler, SchedulerConfig

        self.served, self.max_new_tokens, self.max_lanes = served, max_new_tokens, max_lanes
        runner = served.runner
        self.max_lane_tokens = min(runner.max_context, MAX_LANE_TOKENS)
        lane_bytes = ModelStepper(runner).kv_bytes(self.max_lane_tokens, 0)
        pool = new_pool(runner.decoder, max_lanes * lane_bytes, max_lanes)
        self.stepper = ModelStepper(runner, pool=pool)
        self.scheduler = Scheduler(self.stepper, SchedulerConfig(max_lanes, 1 << 62, max_batch_tokens, pool.num_blocks))

    def run(self, queue: list[tuple[int, MixPrompt]]):
        """Yield (key, prompt ids, answer ids) as lanes finish, keeping the lanes full."""
        from worker.serving.model_stepper import LaneStart
        from worker.serving.scheduler import LaneRequest, StepKind

        pending = list(reversed(queue))
        prompts: dict[str, list[int]] = {}
        while pending or not self.scheduler.idle:
            while pending and self.scheduler.num_waiting < self.max_lanes:
                _, prompt = pending.pop()
                prompt_ids = self.served.encode_chat(
                    list(prompt.messages), list(prompt.tools) if prompt.tools else None
                )
                prompt_ids = prompt_ids[-(self.max_lane_tokens - self.max_new_tokens) :]  # keep the latest turns
                prompts[prompt.key] = prompt_ids
                start = LaneStart(prompt.key, prompt_ids, self.params(prompt))
                blocks = self.stepper.blocks_to_admit(len(prompt_ids))
                most = self.stepper.max_blocks(len(prompt_ids), self.max_new_tokens)
                self.scheduler.submit(LaneRequest((prompt.key, 0), 0, None, start, blocks, most))
            for result in self.scheduler.step():
                if result.kind is StepKind.FAILED:
                    raise RuntimeError(f"prompt {result.key[0]} failed in the engine: {result.error}")
                if result.kind is StepKind.DECODE and result.state.finished:
                    self.scheduler.retire(result.key)
                    key = result.key[0]
                    yield key, prompts.pop(key), list(result.state.output_ids)

    def params(self, prompt: MixPrompt) -> SamplingParams:
        if prompt.temperature == 0.0:
            return SamplingParams(max_tokens=self.max_new_tokens)
        return SamplingParams(max_tokens=self.max_new_tokens, temperature=prompt.temperature, seed=prompt.seed)


def write_shard(path: Path, keys: list[str], sequences: list[list[int]], prompt_lengths: list[int]) -> None:
    offsets = np.cumsum([0] + [len(s) for s in sequences], dtype=np.int64)
    flat = np.fromiter((t for s in sequences for t in s), dtype=np.uint16, count=int(offsets[-1]))
    temporary = path.with_suffix(".tmp.npz")
    np.savez(
        temporary,
        token_ids=flat,
        offsets=offsets,
        prompt_lengths=np.array(prompt_lengths, np.int32),
        keys=np.array(keys),
    )
    os.replace(temporary, path)


@dataclass(slots=True)
class ShardSequence:
    key: str
    token_ids: list[int]
    prompt_length: int


def shard_files(folder: Path) -> list[Path]:
    """The finished shards in `folder`, in shard order (not a `.tmp` a killed run was writing)."""
    return [path for path in sorted(folder.glob("shard-*.npz")) if not path.name.endswith(".tmp.npz")]


def read_shards(folder: Path) -> list[ShardSequence]:
    """Every sequence of every shard in `folder`, in shard order."""
    sequences = []
    for path in shard_files(folder):
        with np.load(path) as shard:
            flat, offsets = shard["token_ids"].astype(np.int64), shard["offsets"]
            for i, key in enumerate(shard["keys"].tolist()):
                ids = flat[offsets[i] : offsets[i + 1]].tolist()
                sequences.append(ShardSequence(key, ids, int(shard["prompt_lengths"][i])))
    return sequences
