"""`arbor generate --speculation MODE --draft PATH --json` for every mode on a tiny model, in process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ops.cli import main
from tests.support.tiny_drafters import one_torch_thread, speculation_checkpoints, write_random_mtp
from tests.support.tiny_models import make_tiny_model

STATS_KEYS = {"target_forwards", "draft_tokens", "accepted_tokens", "tokens_per_forward", "decode_s", "tokens_per_s"}
PROMPT = "the quick brown fox jumps over the lazy dog. the quick brown fox"


def generate_json(capsys, model: Path, mode: str, draft: Path | None) -> dict:
    argv = [
        "generate",
        "--model",
        str(model),
        "--prompt",
        PROMPT,
        "--speculation",
        mode,
        "--max-tokens",
        "24",
        "--dtype",
        "float64",
        "--threads",
        "1",
        "--json",
    ]
    if draft is not None:
        argv += ["--draft", str(draft)]
    with one_torch_thread():  # --threads sets a process-wide count: give the old one back afterwards
        assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_every_mode_generates_the_same_tokens_through_the_cli(capsys, tmp_path):
    checkpoints = speculation_checkpoints("qwen3")
    mtp_head = write_random_mtp(tmp_path / "mtp", checkpoints.target)
    drafts = {"none": None, "mtp": mtp_head, "dflash": checkpoints.dflash, "tree": checkpoints.dflash, "ngram": None}
    drafts["suffix"] = None
    results = {mode: generate_json(capsys, checkpoints.target, mode, draft) for mode, draft in drafts.items()}
    plain = results["none"]
    assert plain["token_ids"] and plain["stats"]["draft_tokens"] == 0
    for mode, result in results.items():
        assert result["speculation"] == mode
        assert result["token_ids"] == plain["token_ids"], mode
        assert result["text"] == plain["text"], mode
        assert set(result["stats"]) >= STATS_KEYS, mode
        if mode != "none":
            assert result["stats"]["draft_tokens"] > 0, mode


def test_mtp_uses_the_head_inside_the_target_checkpoint_without_draft(capsys):
    result = generate_json(capsys, speculation_checkpoints("qwen3").target, "mtp", None)
    assert result["stats"]["draft_tokens"] > 0


@pytest.fixture(scope="module")
def plain_target(tmp_path_factory) -> Path:
    """A target without an MTP head and with no drafter bundled for it."""
    return make_tiny_model(tmp_path_factory.mktemp("plain"), "qwen3", num_hidden_layers=2)


@pytest.mark.parametrize("mode", ["mtp", "dflash", "tree"])
def test_a_mode_without_its_drafter_fails_with_one_clear_line(capsys, plain_target, mode):
    argv = ["generate", "--model", str(plain_target), "--prompt", PROMPT, "--speculation", mode, "--json"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "--draft PATH" in captured.err and captured.err.count("\n") == 1


def test_json_mode_answers_with_json_in_every_mode(capsys):
    """Greedy JSON from a random model: the same tokens in every mode, and JSON as far as they go
    (llguidance's own matcher, fed the tokens, accepts every one)."""
    import llguidance
    import tokenizers

    from shared.structured_output import StructuredOutput

    target = speculation_checkpoints("qwen3").target
    results = []
    for mode in ("none", "ngram"):
        argv = [
            "generate",
            "--model",
            str(target),
            "--prompt",
            PROMPT,
            "--speculation",
            mode,
            "--max-tokens",
            "24",
            "--dtype",
            "float64",
            "--threads",
            "1",
            "--json-mode",
            "--json",
        ]
        with one_torch_thread():
            assert main(argv) == 0
        results.append(json.loads(capsys.readouterr().out))
    assert results[0]["token_ids"] == results[1]["token_ids"]
    tokenizer = tokenizers.Tokenizer.from_file(str(target / "tokenizer.json"))
    grammar = StructuredOutput("json_object", "", "--json-mode").check()
    matcher = llguidance.LLMatcher(llguidance.LLTokenizer(tokenizer.to_str()), grammar, log_level=0)
    answer = [token for token in results[0]["token_ids"] if tokenizer.id_to_token(token) != "<|im_end|>"]
    assert answer and matcher.consume_tokens(answer), (results[0]["text"], matcher.get_error())
