"""Reasoning split: whole outputs by hand, and streaming equal to the whole for every cut."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.server.reasoning import (
    THINK_CLOSE,
    THINK_OPEN,
    ReasoningStream,
    prompt_starts_in_reasoning,
    split_reasoning,
)

CASES = [
    # (output, starts_in_reasoning, reasoning, content)
    ("<think>\nLet me add.\n</think>\n\n4", False, "Let me add.", "4"),
    ("<think>\n\n</think>\n\nHello", False, None, "Hello"),
    ("Hello there", False, None, "Hello there"),
    ("\nHello\n", False, None, "\nHello\n"),
    ("Let me add.\n</think>\n\n4", True, "Let me add.", "4"),
    ("plan\n\nstep\n</think>\n\nok\n", True, "plan\n\nstep", "ok\n"),
    ("<think>\nstill thinking\n", False, "still thinking", ""),
    ("<think>\nstill thinking\n", True, "still thinking", ""),
    ("a <b> c <think>x</think>d", False, "x", "a <b> c d"),
    ("a </think>b", False, None, "a b"),
    ("<think>x<think>\ny</think>z", False, "x\ny", "z"),
    ("<think>a</think>b<think>c</think>d", False, "ac", "bd"),
    ("<thi", False, None, "<thi"),
    ("</th", True, "</th", ""),
    ("x < y <</think>", True, "x < y <", ""),
    ("", True, None, ""),
]


@pytest.mark.parametrize("output, starts, reasoning, content", CASES)
def test_split_reasoning_by_hand(output, starts, reasoning, content):
    assert split_reasoning(output, starts) == (reasoning, content)


def _stream(deltas: list[str], starts: bool) -> tuple[str, str]:
    """Joined (reasoning, content) deltas; no delta holds a tag unless the whole split does
    (the model wrote one around a removed tag: "<" + "</think>" + "think>" leaves "<think>"
    as text, and so does "</" + "<think>" + "think>" inside reasoning)."""
    stream = ReasoningStream(starts)
    parts = [stream.feed(d) for d in deltas] + [stream.finish()]
    whole = "".join(p for p in split_reasoning("".join(deltas), starts) if p)
    if THINK_OPEN not in whole and THINK_CLOSE not in whole:
        for r, c in parts:
            for tag in (THINK_OPEN, THINK_CLOSE):
                assert tag not in r and tag not in c
    return "".join(r for r, _ in parts), "".join(c for _, c in parts)


def _expected(output: str, starts: bool) -> tuple[str, str]:
    reasoning, content = split_reasoning(output, starts)
    return reasoning or "", content


@pytest.mark.parametrize("output, starts, _r, _c", CASES)
def test_stream_every_split_point(output, starts, _r, _c):
    for i in range(len(output) + 1):
        for j in range(i, len(output) + 1):
            deltas = [output[:i], output[i:j], output[j:]]
            assert _stream(deltas, starts) == _expected(output, starts), deltas


def test_stream_one_character_at_a_time():
    output = "<think>\nWe need 2+2.\n\n</think>\n\nThe answer is 4 <ok>."
    assert _stream(list(output), False) == ("We need 2+2.", "The answer is 4 <ok>.")


def test_stream_holds_back_a_partial_tag_until_known():
    stream = ReasoningStream()
    assert stream.feed("<think>\nhm") == ("hm", "")
    assert stream.feed("\n</th") == ("", "")  # a newline and a partial tag: both undecided
    assert stream.feed("ink>\n\nYes<") == ("", "Yes")
    assert stream.feed("3") == ("", "<3")
    assert stream.finish() == ("", "")


def test_prompt_starts_in_reasoning():
    assert prompt_starts_in_reasoning("<|im_start|>assistant\n<think>\n")
    assert not prompt_starts_in_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_starts_in_reasoning("<|im_start|>assistant\n")
    assert not prompt_starts_in_reasoning("user: what is <think>? assistant:")


_PIECES = st.sampled_from(
    [THINK_OPEN, THINK_CLOSE, "<", "</", "<th", "think>", ">", "\n", "\n\n", "a", "b c", "/", "t"]
)


@settings(max_examples=400, deadline=None)
@given(
    pieces=st.lists(_PIECES, max_size=30),
    starts=st.booleans(),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_stream_any_cuts_equal_whole(pieces, starts, cuts):
    output = "".join(pieces)
    points = sorted({c % (len(output) + 1) for c in cuts})
    deltas = [output[a:b] for a, b in zip([0, *points], [*points, len(output)], strict=True)]
    assert "".join(deltas) == output
    assert _stream(deltas, starts) == _expected(output, starts)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(st.text(alphabet="ab \n>/thinkx", max_size=8), min_size=1, max_size=8),
    starts=st.booleans(),
)
def test_no_tag_text_in_either_part(texts, starts):
    """Text without '<' between the tags: neither part ever contains a tag."""
    output = "".join(t + (THINK_OPEN, THINK_CLOSE)[i % 2] for i, t in enumerate(texts))
    reasoning, content = split_reasoning(output, starts)
    for tag in (THINK_OPEN, THINK_CLOSE):
        assert tag not in (reasoning or "") and tag not in content
