"""The default model (SmolLM2-135M-Instruct GGUF) through our loader vs transformers' own GGUF load."""

from __future__ import annotations

import pytest
import torch
import transformers

from shared.sampling import SamplingParams
from worker.engine.generate import generate
from worker.models.default_model import default_model_path
from worker.serving_model import load_serving_model

PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three prime numbers.",
]


@pytest.fixture(scope="module")
def models():
    served = load_serving_model(None, "none")
    path = default_model_path()
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    return served, reference


def test_logits_match_transformers_gguf_load(models):
    served, reference = models
    prompt_ids = served.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    cache = served.loaded.decoder.new_cache(len(prompt_ids))
    ours = served.loaded.decoder(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), cache).logits
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt_ids])).logits[0]
    assert (ours - theirs).abs().max().item() < 1e-3


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_continuation_matches_transformers(models, prompt):
    served, reference = models
    prompt_ids = served.encode_chat([{"role": "user", "content": prompt}])
    ours = generate(served.runner, served.tokenizer, prompt_ids, SamplingParams(max_tokens=24))
    with torch.no_grad():  # both stop at the model's eos (<|im_end|>) or after 24 tokens
        theirs = reference.generate(torch.tensor([prompt_ids]), max_new_tokens=24, do_sample=False, pad_token_id=0)[
            0, len(prompt_ids) :
        ].tolist()
    assert ours.token_ids == theirs


def test_chat_prompt_matches_transformers_template(models):
    served, _ = models
    path = default_model_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    expected = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert served.template.render(messages, add_generation_prompt=True) == expected


def test_generate_cli_json(capsys):
    from ops.cli import main

    argv = ["generate", "--prompt", "The capital of France is", "--max-tokens", "8", "--json"]
    assert main([*argv, "--speculation", "none"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert len(out["token_ids"]) == 8 and out["text"]
    assert out["stats"]["target_forwards"] == 8 and out["stats"]["tokens_per_forward"] == 1.0
    assert {"draft_tokens", "accepted_tokens", "decode_s", "tokens_per_s"} <= set(out["stats"])
    assert main(argv) == 0  # the served default, losslessly the same tokens
    default = json.loads(capsys.readouterr().out)
    assert default["speculation"] == "auto" and default["token_ids"] == out["token_ids"]


def test_prompt_logprobs_match_transformers(models):
    """echo + logprobs' numbers on the default model's float32 path: each prompt token's logprob
    from the prefill equals a transformers forward's within 2e-3 (the logits agree within 1e-3)."""
    from worker.serving.model_stepper import LaneStart, ModelStepper

    served, reference = models
    prompt_ids = served.encode_text("The capital of France is Paris. The capital of Italy is Rome.")
    stepper = ModelStepper(served.runner)
    state = stepper.start(LaneStart("score", prompt_ids, SamplingParams(max_tokens=0), num_prompt_logprobs=1))
    while stepper.num_to_prefill(state):
        stepper.prefill(state, 8)
    assert state.finished and state.output_ids == []
    with torch.no_grad():
        expected = torch.log_softmax(reference(torch.tensor([prompt_ids])).logits[0, :-1].float(), dim=-1)
    entries = state.sequence.prompt_logprobs.entries
    assert [ranked.entry.token_id for ranked in entries] == prompt_ids[1:]
    ours = torch.tensor([ranked.entry.logprob for ranked in entries])
    theirs = expected[torch.arange(len(prompt_ids) - 1), torch.tensor(prompt_ids[1:])]
    assert (ours - theirs).abs().max().item() < 2e-3
