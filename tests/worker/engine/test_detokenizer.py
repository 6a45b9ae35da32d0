"""IncrementalDetokenizer: streamed text must add up to the one-shot decode, never showing half a character."""

from __future__ import annotations

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders
from tokenizers.models import WordLevel

from tests.support.fuzz import fuzz_examples
from tests.support.smollm2_tokenizer import converted_tokenizer_dir
from worker.engine.detokenizer import IncrementalDetokenizer

REPLACEMENT = "\ufffd"


@pytest.fixture(scope="module")
def smollm2(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tokenizers.Tokenizer:
    """The default model's tokenizer (ByteLevel BPE), as transformers converts it from the GGUF."""
    folder = converted_tokenizer_dir(request, tmp_path_factory)
    return tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))


def _byte_level_chars() -> dict[int, str]:
    """GPT-2's byte -> vocabulary character table (ByteLevel tokenizers spell raw bytes with it)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = iter(range(256, 512))
    return {b: chr(b if b in printable else next(shifted)) for b in range(256)}


def _byte_token_ids(tokenizer: tokenizers.Tokenizer, text: str) -> list[int]:
    chars = _byte_level_chars()
    return [tokenizer.token_to_id(chars[b]) for b in text.encode()]


def _stream(detokenizer: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    return [detokenizer.push(chunk) for chunk in chunks] + [detokenizer.flush()]


def _chunked(ids: list[int], cuts: list[int]) -> list[list[int]]:
    bounds = [0, *sorted(c % (len(ids) + 1) for c in cuts), len(ids)]
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


# --- the default model's byte-level tokenizer -----------------------------------------------------


def test_token_by_token_stream_equals_decode(smollm2) -> None:
    text = "Hello, world! 你好, naïve café 🙂🚀 — done."
    ids = smollm2.encode(text).ids
    pieces = _stream(IncrementalDetokenizer(smollm2), [[i] for i in ids])
    assert "".join(pieces) == smollm2.decode(ids) == text


def test_emoji_split_over_byte_tokens_is_held_until_complete(smollm2) -> None:
    ids = _byte_token_ids(smollm2, "🙂")  # F0 9F 99 82: four byte tokens
    detokenizer = IncrementalDetokenizer(smollm2)
    assert [detokenizer.push([i]) for i in ids] == ["", "", "", "🙂"]
    assert detokenizer.flush() == ""


def test_flush_releases_an_unfinished_character_as_replacement(smollm2) -> None:
    detokenizer = IncrementalDetokenizer(smollm2)
    assert detokenizer.push(smollm2.encode("ok").ids) == "ok"
    assert detokenizer.push(_byte_token_ids(smollm2, "中")[:2]) == ""
    assert detokenizer.flush() == REPLACEMENT
    assert detokenizer.flush() == ""


def test_special_tokens_are_skipped_or_kept(smollm2) -> None:
    im_end = smollm2.token_to_id("<|im_end|>")
    ids = smollm2.encode("Hi").ids + [im_end]
    assert "".join(_stream(IncrementalDetokenizer(smollm2), [[i] for i in ids])) == "Hi"
    kept = IncrementalDetokenizer(smollm2, skip_special_tokens=False)
    assert "".join(_stream(kept, [[i] for i in ids])) == "Hi<|im_end|>"


def test_prompt_gives_left_context_but_is_not_emitted(smollm2) -> None:
    prompt = smollm2.encode("<|im_start|>assistant\nSure").ids
    output = smollm2.encode(", here it is").ids
    assert "".join(_stream(IncrementalDetokenizer(smollm2, prompt), [[i] for i in output])) == ", here it is"


@st.composite
def byte_level_ids(draw: st.DrawFn, tokenizer: tokenizers.Tokenizer) -> list[int]:
    """Ids mixing whole words, raw byte tokens of multi-byte characters, arbitrary ids and specials."""
    text = draw(st.text(alphabet=st.sampled_from("ab é中🙂Ω\n😀한"), max_size=6))
    pieces = [
        tokenizer.encode(text).ids,
        [i for i in _byte_token_ids(tokenizer, draw(st.sampled_from(["é", "中", "🙂", "한", "Ω"]))) if i is not None],
        draw(st.lists(st.integers(0, tokenizer.get_vocab_size() - 1), max_size=4)),
        draw(st.lists(st.sampled_from([0, 1, 2]), max_size=2)),  # <|endoftext|>, <|im_start|>, <|im_end|>
    ]
    order = draw(st.permutations(range(len(pieces))))
    return [i for k in order for i in pieces[k]]


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(data=st.data(), skip_special_tokens=st.booleans())
def test_any_chunking_adds_up_to_decode(smollm2, data: st.DataObject, skip_special_tokens: bool) -> None:
    ids = data.draw(byte_level_ids(smollm2))
    ids += data.draw(byte_level_ids(smollm2))
    chunks = _chunked(ids, data.draw(st.lists(st.integers(0, 1000), max_size=8)))
    pieces = _stream(IncrementalDetokenizer(smollm2, skip_special_tokens=skip_special_tokens), chunks)
    assert "".join(pieces) == smollm2.decode(ids, skip_special_tokens=skip_special_tokens)
    # Before the flush, a piece never ends inside a character.
    assert not any(piece.endswith(REPLACEMENT) for piece in pieces[:-1])


@settings(max_examples=fuzz_examples(100), deadline=None)
@given(data=st.data())
def test_output_after_a_prompt_continues_its_text(smollm2, data: st.DataObject) -> None:
    prompt = data.draw(byte_level_ids(smollm2))
    prompt_text = smollm2.decode(prompt)
    output = data.draw(byte_level_ids(smollm2))
    chunks = _chunked(output, data.draw(st.lists(st.integers(0, 1000), max_size=6)))
    streamed = "".join(_stream(IncrementalDetokenizer(smollm2, prompt), chunks))
    if not prompt_text.endswith(REPLACEMENT):  # a prompt ending mid-character cannot be continued
        assert prompt_text + streamed == smollm2.decode(prompt + output)


# --- a SentencePiece-style decoder: the first token of a decode loses its leading space -----------

WORDS = ["<s>", "▁Hello", "▁world", "▁", "lo", "!", "▁a", "b", "▁▁c"]


@pytest.fixture(scope="module")
def metaspace() -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<s>"))
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tokenizer.add_special_tokens(["<s>"])
    return tokenizer


def test_leading_spaces_survive_token_by_token_streaming(metaspace) -> None:
    ids = [WORDS.index(w) for w in ["▁Hello", "▁world", "!", "▁a", "b"]]
    assert "".join(metaspace.decode([i]) for i in ids) == "Helloworld!ab"  # the naive way loses them
    pieces = _stream(IncrementalDetokenizer(metaspace), [[i] for i in ids])
    assert pieces == ["Hello", " world", "!", " a", "b", ""]


def test_first_output_token_keeps_its_space_after_a_prompt(metaspace) -> None:
    prompt = [WORDS.index("▁Hello")]
    detokenizer = IncrementalDetokenizer(metaspace, prompt)
    assert detokenizer.push([WORDS.index("▁world")]) == " world"


@settings(max_examples=fuzz_examples(150), deadline=None)
@given(
    prompt=st.lists(st.integers(0, len(WORDS) - 1), max_size=8),
    output=st.lists(st.integers(0, len(WORDS) - 1), max_size=12),
    cuts=st.lists(st.integers(0, 100), max_size=6),
)
def test_metaspace_stream_continues_the_prompt_text(metaspace, prompt, output, cuts) -> None:
    streamed = "".join(_stream(IncrementalDetokenizer(metaspace, prompt), _chunked(output, cuts)))
    if prompt:
        prompt_text = metaspace.decode(prompt)
        assert prompt_text + streamed == metaspace.decode(prompt + output)
    else:
        assert streamed == metaspace.decode(output)
