"""Scoring prompts through the live stack: echo + logprobs, vLLM's prompt_logprobs, max_tokens 0,
and the tokenizer endpoints, against the model itself (a transformers float32 forward of the same
tokens: logprobs within 1e-4) and its tokenizer."""

from __future__ import annotations

import functools
from pathlib import Path

import httpx
import openai
import pytest
import tokenizers
import torch
import transformers

from tests.e2e.live_stack import TINY_CONTEXT, TINY_MODEL, Stack
from tests.support.tiny_models import CHATML_TEMPLATE, make_tiny_model

ATOL = 1e-4
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The stack's tiny model, built again the same way (seeded): the oracle's copy."""
    return make_tiny_model(tmp_path_factory.mktemp("oracle") / TINY_MODEL, max_position_embeddings=TINY_CONTEXT)


@pytest.fixture(scope="module")
def http(stack: Stack) -> httpx.Client:
    return stack.http()


@functools.cache
def reference(folder: Path) -> transformers.PreTrainedModel:
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def reference_logprobs(folder: Path, token_ids: list[int]) -> torch.Tensor:  # [T - 1, V]: row i scores token i + 1
    with torch.inference_mode():
        logits = reference(folder)(torch.tensor([token_ids])).logits[0].float()
    return torch.log_softmax(logits[:-1], dim=-1)


def encode(folder: Path, text: str) -> list[int]:
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(http: httpx.Client, tiny: Path) -> None:
    ids = encode(tiny, TEXT)
    body = {"model": TINY_MODEL, "prompt": TEXT, "echo": True, "logprobs": 2, "max_tokens": 0}
    reply = http.post("/v1/completions", json=body).json()
    (choice,) = reply["choices"]
    logprobs = choice["logprobs"]
    assert choice["text"] == TEXT and choice["finish_reason"] == "length"
    assert reply["usage"]["completion_tokens"] == 0 and reply["usage"]["prompt_tokens"] == len(ids)
    assert len(logprobs["tokens"]) == len(ids) and "".join(logprobs["tokens"]) == TEXT
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    expected = reference_logprobs(tiny, ids)
    for position, token in enumerate(ids[1:]):
        assert logprobs["token_logprobs"][position + 1] == pytest.approx(expected[position, token].item(), abs=ATOL)
        top = logprobs["top_logprobs"][position + 1]
        assert len(top) <= 2 and max(top.values()) == pytest.approx(expected[position].max().item(), abs=ATOL)


def test_lm_evals_request_gets_the_prompt_then_the_generated_token(http: httpx.Client, tiny: Path) -> None:
    """local-completions' loglikelihood body: token ids, max_tokens 1, logprobs 1, echo."""
    ids = encode(tiny, TEXT)
    body = {"model": TINY_MODEL, "prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
    (choice,) = http.post("/v1/completions", json=body).json()["choices"]
    token_logprobs, top = choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"]
    assert len(token_logprobs) == len(ids) + 1  # the prompt, then the one generated token
    expected = reference_logprobs(tiny, ids)
    greedy = [
        expected[position, token].item() == expected[position].max().item() for position, token in enumerate(ids[1:])
    ]
    assert [logprob == max(entry.values()) for logprob, entry in zip(token_logprobs[1:-1], top[1:-1])] == greedy
    assert token_logprobs[-1] == max(top[-1].values())  # greedy: the generated token is the top one


def test_prompt_logprobs_in_vllms_shape(http: httpx.Client, tiny: Path) -> None:
    ids = encode(tiny, TEXT)
    body = {"model": TINY_MODEL, "prompt": TEXT, "prompt_logprobs": 3, "max_tokens": 2, "temperature": 0}
    (choice,) = http.post("/v1/completions", json=body).json()["choices"]
    positions = choice["prompt_logprobs"]
    assert choice["logprobs"] is None and len(positions) == len(ids) and positions[0] is None
    expected = reference_logprobs(tiny, ids)
    for position, (token, entries) in enumerate(zip(ids[1:], positions[1:], strict=True)):
        row = expected[position]
        own = entries[str(token)]
        assert own["logprob"] == pytest.approx(row[token].item(), abs=ATOL)
        surely_above, maybe_above = int((row > row[token] + ATOL).sum()), int((row > row[token] - ATOL).sum())
        assert surely_above + 1 <= own["rank"] <= maybe_above + 1
        top_ids = [
            int(token_id) for token_id, entry in entries.items() if entry["rank"] <= 3 and token_id != str(token)
        ]
        assert set(top_ids) <= set(row.topk(3).indices.tolist())
        assert len(entries) in (3, 4)  # the top 3, and the prompt token if it is not among them


def test_streamed_echo_with_logprobs_equals_the_whole_body(client: openai.OpenAI) -> None:
    params = dict(model=TINY_MODEL, prompt=TEXT, echo=True, logprobs=1, max_tokens=3, temperature=0)
    whole = client.completions.create(**params).choices[0]
    chunks = [chunk.choices[0] for chunk in client.completions.create(stream=True, **params) if chunk.choices]
    streamed = [logprob for chunk in chunks if chunk.logprobs for logprob in chunk.logprobs.token_logprobs]
    assert "".join(chunk.text for chunk in chunks) == whole.text
    assert streamed == whole.logprobs.token_logprobs and streamed[0] is None


def test_max_tokens_zero_needs_something_to_return(http: httpx.Client) -> None:
    reply = http.post("/v1/completions", json={"model": TINY_MODEL, "prompt": TEXT, "max_tokens": 0})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "max_tokens"
    echoed = http.post("/v1/completions", json={"model": TINY_MODEL, "prompt": TEXT, "max_tokens": 0, "echo": True})
    assert echoed.json()["choices"][0]["text"] == TEXT


@pytest.fixture(scope="module")
def client(stack: Stack) -> openai.OpenAI:
    return stack.openai()


def test_tokenize_and_detokenize_agree_with_the_tokenizer(http: httpx.Client, tiny: Path) -> None:
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny / "tokenizer.json"))
    text = "<|im_start|>user\nHello there<|im_end|>"  # special tokens in the text are matched as such
    reply = http.post("/tokenize", json={"model": TINY_MODEL, "prompt": text, "add_special_tokens": False}).json()
    assert reply["tokens"] == hf.encode(text, add_special_tokens=False) and reply["count"] == len(reply["tokens"])
    assert reply["tokens"][0] == hf.convert_tokens_to_ids("<|im_start|>") and reply["max_model_len"] == TINY_CONTEXT
    strs = http.post("/tokenize", json={"model": TINY_MODEL, "prompt": text, "return_token_strs": True}).json()
    assert strs["token_strs"] == hf.convert_ids_to_tokens(reply["tokens"])
    assert http.post("/detokenize", json={"model": TINY_MODEL, "tokens": reply["tokens"]}).json() == {"prompt": text}


def test_tokenize_renders_messages_with_the_chat_template(http: httpx.Client, tiny: Path) -> None:
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tiny / "tokenizer.json"))
    hf.chat_template = CHATML_TEMPLATE
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    for add_generation_prompt in (True, False):
        body = {"model": TINY_MODEL, "messages": messages, "add_generation_prompt": add_generation_prompt}
        tokens = http.post("/tokenize", json=body).json()["tokens"]
        text = hf.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)
        assert tokens == hf.encode(text, add_special_tokens=False)


def test_tokenizer_info_names_what_lm_eval_reads(http: httpx.Client) -> None:
    """lm-eval's remote tokenizer sends no model: with two served here, it must name one."""
    unnamed = http.get("/tokenizer_info")
    assert unnamed.status_code == 400 and unnamed.json()["error"]["param"] == "model"
    info = http.get("/tokenizer_info", params={"model": TINY_MODEL}).json()
    assert info["eos_token"] == "<|im_end|>" and info["chat_template"] == CHATML_TEMPLATE
    assert info["model_max_length"] == TINY_CONTEXT and info["bos_token"] is None


def test_a_token_outside_the_vocabulary_is_a_400_from_the_worker(http: httpx.Client) -> None:
    reply = http.post("/detokenize", json={"model": TINY_MODEL, "tokens": [1, 10**6]})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "10" in error["message"] and "tokens" in error["message"]


def test_a_batch_of_prompts_scores_each_as_alone(http: httpx.Client, tiny: Path) -> None:
    prompts = [encode(tiny, TEXT), encode(tiny, "def add(a, b): return a + b")]
    body = {"model": TINY_MODEL, "max_tokens": 0, "logprobs": 0, "echo": True}
    batch = http.post("/v1/completions", json=body | {"prompt": prompts}).json()["choices"]
    alone = [http.post("/v1/completions", json=body | {"prompt": ids}).json()["choices"][0] for ids in prompts]
    assert [choice["logprobs"]["token_logprobs"] for choice in batch] == [
        choice["logprobs"]["token_logprobs"] for choice in alone
    ]
    assert [len(choice["logprobs"]["tokens"]) for choice in batch] == [len(ids) for ids in prompts]
