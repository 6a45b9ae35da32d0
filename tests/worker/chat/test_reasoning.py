from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.fuzz import fuzz_examples
from worker.chat.reasoning import ReasoningDelta, ReasoningParser

# Fragments that make tags, near-tags and split tags likely.
texts = st.lists(
    st.sampled_from(["<think>", "</think>", "<", "</", "think", ">", "<th", "ink>", "a", "b c", "\n", " "]),
    max_size=14,
).map("".join)


def reference(text: str, starts_in_reasoning: bool = False) -> tuple[str, str]:
    """(reasoning, content) for the whole text at once, written with plain str.find."""
    if starts_in_reasoning:
        if text.lstrip().startswith("<think>"):
            text = text.lstrip()[len("<think>") :]
        i = text.find("</think>")
        return (text, "") if i < 0 else (text[:i], text[i + len("</think>") :])
    i = text.find("<think>")
    if i < 0:
        return "", text
    before, rest = text[:i], text[i + len("<think>") :]
    j = rest.find("</think>")
    return (rest, before) if j < 0 else (rest[:j], before + rest[j + len("</think>") :])


def run(parser: ReasoningParser, chunks: list[str]) -> tuple[str, str]:
    deltas = [parser.feed(chunk) for chunk in chunks] + [parser.flush()]
    return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(points, points[1:])]


def test_reasoning_then_content():
    parser = ReasoningParser()
    assert parser.feed("<think>hmm</think>Answer") == ReasoningDelta(reasoning="hmm", content="Answer")
    assert not parser.in_reasoning


def test_tag_split_across_chunks_is_held_until_known():
    parser = ReasoningParser(starts_in_reasoning=True)
    assert parser.in_reasoning
    assert parser.feed("abc</th") == ReasoningDelta(reasoning="abc")
    assert parser.feed("ink>xyz") == ReasoningDelta(content="xyz")


def test_near_tag_is_released_as_text():
    parser = ReasoningParser(starts_in_reasoning=True)
    parser.feed("abc</th")
    assert parser.feed("ought") == ReasoningDelta(reasoning="</thought")


def test_flush_emits_a_held_partial_tag_as_text():
    parser = ReasoningParser()
    assert parser.feed("x <thin") == ReasoningDelta(content="x ")
    assert parser.flush() == ReasoningDelta(content="<thin")


def test_second_think_block_is_content():
    assert run(ReasoningParser(), ["<think>a</think>b<think>c</think>"]) == ("a", "b<think>c</think>")


def test_prompt_opened_reasoning_drops_a_repeated_start_tag():
    assert run(ReasoningParser(starts_in_reasoning=True), ["\n<th", "ink>r</think>c"]) == ("r", "c")


def test_force_end_switches_to_content_and_drops_the_forced_tag():
    parser = ReasoningParser()
    assert parser.feed("<think>long thought </th") == ReasoningDelta(reasoning="long thought ")
    assert parser.in_reasoning
    parser.force_end()
    assert not parser.in_reasoning
    # The held "</th" was reasoning text; the worker's forced "\n</think>" is swallowed.
    assert parser.feed("\n</think>") == ReasoningDelta(reasoning="</th")
    assert parser.feed("\n\nAnswer</think>") == ReasoningDelta(content="\n\nAnswer</think>")


def test_force_end_without_a_forced_tag_keeps_following_text():
    parser = ReasoningParser(starts_in_reasoning=True)
    parser.feed("r")
    parser.force_end()
    assert run(parser, ["\n", "Answer"]) == ("", "\nAnswer")


def test_force_end_outside_reasoning_is_a_no_op():
    parser = ReasoningParser()
    parser.feed("plain ")
    parser.force_end()
    assert run(parser, ["</think>x"]) == ("", "</think>x")


@settings(max_examples=fuzz_examples(400), deadline=None)
@given(text=texts, cuts=st.lists(st.integers(0, 200), max_size=10), starts_in=st.booleans())
def test_any_chunking_matches_the_whole_text_reference(text, cuts, starts_in):
    expected = reference(text, starts_in)
    assert run(ReasoningParser(starts_in_reasoning=starts_in), [text]) == expected
    assert run(ReasoningParser(starts_in_reasoning=starts_in), split(text, cuts)) == expected
    assert run(ReasoningParser(starts_in_reasoning=starts_in), list(text)) == expected


@settings(max_examples=fuzz_examples(200), deadline=None)
@given(before=texts, after=texts, cuts=st.lists(st.integers(0, 200), max_size=8))
def test_force_end_result_does_not_depend_on_chunking(before, after, cuts):
    def forced(chunks_before, chunks_after):
        parser = ReasoningParser(starts_in_reasoning=True)
        deltas = [parser.feed(c) for c in chunks_before]
        parser.force_end()
        deltas += [parser.feed(c) for c in chunks_after] + [parser.flush()]
        return "".join(d.reasoning for d in deltas), "".join(d.content for d in deltas)

    whole = forced([before], [after])
    assert forced(split(before, cuts), split(after, cuts)) == whole
    assert forced(list(before), list(after)) == whole
    # Nothing after the forced close counts as reasoning.
    assert forced([before], [after])[0] == forced([before], [])[0]
