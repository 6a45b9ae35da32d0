"""StopStringMatcher: streamed chunks must give exactly the single-shot result."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fuzz import fuzz_examples
from worker.engine.stop_strings import StopStringMatcher


def _reference(text: str, stops: list[str], include_stop: bool = False) -> tuple[str, bool]:
    """Read `text` one character at a time; stop at the first stop string to complete."""
    for end in range(1, len(text) + 1):
        starts = [end - len(stop) for stop in stops if text[:end].endswith(stop)]
        if starts:
            return text[: end if include_stop else min(starts)], True
    return text, False


def _stream(stops: list[str], chunks: list[str], include_stop: bool = False) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops, include_stop)
    emitted, hit = [], False
    for chunk in chunks:
        text, hit = matcher.feed(chunk)
        emitted.append(text)
        if hit:
            break
    if not hit:
        emitted.append(matcher.flush())
    return "".join(emitted), hit


def test_stop_string_split_across_chunks_is_cut_before_it() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("42</an") == ("42", False)
    assert matcher.feed("swer> junk") == ("", True)
    assert matcher.feed("more") == ("", True)  # stays stopped
    assert matcher.flush() == ""


def test_holds_back_only_a_possible_stop_prefix() -> None:
    matcher = StopStringMatcher(["STOP"])
    assert matcher.feed("abcST") == ("abc", False)
    assert matcher.feed("x") == ("STx", False)  # not a stop after all: released
    assert matcher.feed("S") == ("", False)
    assert matcher.flush() == "S"


def test_first_completed_stop_wins_even_if_a_longer_one_started_earlier() -> None:
    # "abcd" started first but "c" completes first; generation would have stopped there.
    assert _stream(["abcd", "c"], ["ab", "c", "d"]) == ("ab", True)
    assert _stream(["abcd", "c"], ["abcd"]) == ("ab", True)


def test_among_stops_ending_together_the_longest_wins() -> None:
    assert _stream(["b", "ab"], ["xab"]) == ("x", True)
    assert _stream(["b", "ab"], ["xa", "b"]) == ("x", True)


def test_stop_at_the_very_start_emits_nothing() -> None:
    assert _stream(["\n\n"], ["\n", "\nrest"]) == ("", True)


def test_without_stop_strings_everything_passes_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.feed("abc") == ("abc", False)
    assert matcher.flush() == ""


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"stop\[1\]=''"):
        StopStringMatcher(["x", ""])


@st.composite
def text_and_chunks(draw: st.DrawFn) -> tuple[list[str], str, list[str]]:
    alphabet = "ab<>/é🙂\n"  # small, so stop strings actually occur
    stops = draw(st.lists(st.text(alphabet, min_size=1, max_size=4), min_size=0, max_size=3))
    text = draw(st.text(alphabet, max_size=30))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    bounds = [0, *cuts, len(text)]
    return stops, text, [text[a:b] for a, b in zip(bounds, bounds[1:])]


@settings(max_examples=fuzz_examples(500), deadline=None)
@given(text_and_chunks())
def test_any_chunking_matches_the_single_shot_result(case: tuple[list[str], str, list[str]]) -> None:
    stops, text, chunks = case
    assert _stream(stops, chunks) == _reference(text, stops)
    assert _stream(stops, [text]) == _reference(text, stops)


def test_include_stop_keeps_the_stop_string_and_nothing_after_it() -> None:
    matcher = StopStringMatcher(["</answer>"], include_stop=True)
    assert matcher.feed("42</an") == ("42", False)
    assert matcher.feed("swer> junk") == ("</answer>", True)
    assert _stream(["abcd", "c"], ["abcd"], include_stop=True) == ("abc", True)


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(text_and_chunks())
def test_any_chunking_matches_the_single_shot_result_with_the_stop_included(
    case: tuple[list[str], str, list[str]],
) -> None:
    stops, text, chunks = case
    assert _stream(stops, chunks, include_stop=True) == _reference(text, stops, include_stop=True)


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(text_and_chunks())
def test_emitted_text_never_contains_a_stop_string(case: tuple[list[str], str, list[str]]) -> None:
    stops, _, chunks = case
    emitted, _ = _stream(stops, chunks)
    assert not any(stop in emitted for stop in stops)


def test_within_min_tokens_a_stop_string_does_not_end_the_text() -> None:
    from tests.support.tiny_models import train_tokenizer
    from worker.engine.text_output import TextOutput

    tokenizer = train_tokenizer()
    ids = tokenizer.encode("the cat sat on the mat and the cat ran", add_special_tokens=False).ids
    first_cat = next(i for i in range(len(ids)) if "cat" in tokenizer.decode(ids[: i + 1]))

    def text(min_tokens: int) -> str:
        output = TextOutput(tokenizer, ["cat"], min_tokens=min_tokens)
        pieces = [output.add([token]) for token in ids]
        return "".join(pieces) + output.finish()

    assert text(0) == "the "
    assert text(first_cat + 1) == "the cat sat on the mat and the "  # the first "cat" came within min_tokens
