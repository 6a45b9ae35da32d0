"""Drafter data through the batched engine: each answer is what plain decoding of that prompt
alone emits (greedy, and seeded sampling), a killed run resumes without answering any prompt
twice and ends with the shards an uninterrupted run writes, and shards of other settings are
refused. A tiny random target; the real scheduler, stepper and block pool."""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

import pytest

from ops.training.engine_data import generate_shards, read_shards, shard_path
from ops.training.prompt_mix import MixPrompt, prompt_mix
from ops.training.prompts import HELD_OUT
from ops.training.train_drafter import parse_part
from shared.sampling import SamplingParams
from tests.support.tiny_drafters import one_torch_thread
from tests.support.tiny_models import make_tiny_model
from worker.engine.generate import generate
from worker.serving_model import load_serving_model

MAX_NEW_TOKENS = 20
SHARD_SIZE = 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    with one_torch_thread():
        yield


@functools.cache
def served():
    folder = make_tiny_model(Path(tempfile.mkdtemp(prefix="arbor-engine-data-")) / "tiny", "qwen3")
    return load_serving_model(folder, "none")


def prompts(count: int = 11) -> list[MixPrompt]:
    """Chat prompts of different lengths, every third sampled, as the mix makes them."""
    topics = ["bees", "the moon", "a small red boat on a lake at dawn", "tea", "rain in the city at night"]
    items = []
    for index in range(count):
        text = f"Tell me about {topics[index % len(topics)]}, part {index}."
        sampled = index % 3 == 2
        messages = ({"role": "user", "content": text},)
        items.append(MixPrompt(f"chat/{index}", messages, None, 0.7 if sampled else 0.0, 1000 + index))
    return items


class Interrupted(Exception):
    pass


def test_answers_equal_plain_decoding_of_each_prompt_alone(tmp_path):
    model = served()
    stats = generate_shards(model, prompts(), tmp_path, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=5, max_batch_tokens=32)
    sequences = read_shards(tmp_path)
    assert [s.key for s in sequences] == [p.key for p in prompts()]
    assert stats.generated_tokens == sum(len(s.token_ids) - s.prompt_length for s in sequences) > 0
    for prompt, sequence in zip(prompts(), sequences, strict=True):
        prompt_ids = model.encode_chat(list(prompt.messages))
        params = SamplingParams(max_tokens=MAX_NEW_TOKENS, temperature=prompt.temperature, seed=prompt.seed)
        alone = generate(model.runner, model.tokenizer, prompt_ids, params)
        assert sequence.token_ids == prompt_ids + alone.token_ids, prompt.key


def test_a_killed_run_resumes_without_answering_a_prompt_twice(tmp_path):
    model = served()
    whole = tmp_path / "whole"
    generate_shards(model, prompts(), whole, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3)

    def kill_after_first_shard(stats):
        raise Interrupted

    resumed = tmp_path / "resumed"
    with pytest.raises(Interrupted):
        generate_shards(model, prompts(), resumed, MAX_NEW_TOKENS, SHARD_SIZE, 3, progress=kill_after_first_shard)
    first = {s.key for s in read_shards(resumed)}
    assert len(first) == SHARD_SIZE, "one whole shard was written before the kill"
    shard_path(resumed, 2).with_suffix(".tmp.npz").write_bytes(b"half a shard")  # a write the kill cut off
    second = generate_shards(model, prompts(), resumed, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3)
    assert second.skipped_shards == 1
    assert not first & set(second.generated_keys), "a prompt of a finished shard was answered again"
    assert first | set(second.generated_keys) == {p.key for p in prompts()}
    expected = [(s.key, s.token_ids, s.prompt_length) for s in read_shards(whole)]
    assert [(s.key, s.token_ids, s.prompt_length) for s in read_shards(resumed)] == expected
    third = generate_shards(model, prompts(), resumed, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3)
    assert third.generated_keys == [] and third.written_shards == 0


def test_processes_sharing_a_folder_answer_each_shard_once(tmp_path):
    model = served()
    whole = tmp_path / "whole"
    generate_shards(model, prompts(), whole, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3)
    shared = tmp_path / "shared"
    second = generate_shards(model, prompts(), shared, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3, part=(1, 2))
    assert sorted(p.name for p in shared.glob("shard-*.npz")) == [shard_path(shared, 1).name]
    first = generate_shards(model, prompts(), shared, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=3, part=(0, 2))
    assert first.written_shards == 2 and not set(first.generated_keys) & set(second.generated_keys)
    expected = [(s.key, s.token_ids, s.prompt_length) for s in read_shards(whole)]
    assert [(s.key, s.token_ids, s.prompt_length) for s in read_shards(shared)] == expected


@pytest.mark.parametrize("text", ["2/2", "1", "a/2", "-1/2"])
def test_a_part_outside_its_count_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="I/N|0 to N-1"):
        parse_part(text)


def test_shards_made_with_other_settings_or_another_mix_are_refused(tmp_path):
    generate_shards(served(), prompts(4), tmp_path, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate_shards(served(), prompts(4), tmp_path, MAX_NEW_TOKENS + 1, SHARD_SIZE, max_lanes=2)
    with pytest.raises(ValueError, match="other prompts"):
        generate_shards(served(), prompts(5)[1:], tmp_path, MAX_NEW_TOKENS, SHARD_SIZE, max_lanes=2)


def test_the_mix_is_broad_keyed_once_and_leaves_the_held_out_prompts_out():
    mix = prompt_mix()
    keys = [p.key for p in mix]
    assert len(set(keys)) == len(keys)
    assert {key.split("/")[0] for key in keys} == {"chat", "code", "tools", "agent", "docs", "pipdocs"}
    assert not {m["content"] for p in mix for m in p.messages} & set(HELD_OUT)
    assert any(p.tools for p in mix) and any(p.temperature > 0 for p in mix)
    assert any(m["role"] == "tool" for p in mix for m in p.messages)
    assert [p.key for p in prompt_mix()] == keys, "the order is reproducible"
