"""Tool-call parsers: hand-written outputs per family parse to the expected content and calls,
and every way of splitting an output into stream deltas gives the same result."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from appliance.server.tools import (
    PARSERS,
    ContentDelta,
    ToolCallDelta,
    parser_for,
)

CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}}'
CALL_ARGS = '{"city": "Paris", "unit": "°C"}'
CALL2 = '{"name": "get_time", "arguments": {"zone": "CET"}}'
CALL2_ARGS = '{"zone": "CET"}'
LCALL = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "°C"}}'
LCALL2 = '{"name": "get_time", "arguments": {"zone": "CET"}}'

# (family, output, content, [(name, arguments)])
CASES = [
    ("hermes", "The answer is 42.", "The answer is 42.", []),
    ("hermes", f"<tool_call>\n{CALL}\n</tool_call>", "", [("get_weather", CALL_ARGS)]),
    (
        "hermes",
        f"<tool_call>\n{CALL}\n</tool_call>\n<tool_call>\n{CALL2}\n</tool_call>",
        "",
        [("get_weather", CALL_ARGS), ("get_time", CALL2_ARGS)],
    ),
    (
        "hermes",
        f"Let me check.\n\n<tool_call>\n{CALL}\n</tool_call>\n",
        "Let me check.",
        [("get_weather", CALL_ARGS)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "f", "arguments": {"a": </tool_call> after',
        '<tool_call>\n{"name": "f", "arguments": {"a": </tool_call> after',
        [],
    ),
    ("hermes", f"Sure <tool_call>\n{CALL}\n", f"Sure <tool_call>\n{CALL}\n", []),
    ("hermes", "a < b and <tool> x <tool_", "a < b and <tool> x <tool_", []),
    (
        "hermes",
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>',
        "",
        [("f", '{"a": 1}')],
    ),
    ("hermes", '<tool_call>{"name": "now"}</tool_call>', "", [("now", "{}")]),
    ("llama3_json", "The answer is 42.", "The answer is 42.", []),
    ("llama3_json", LCALL, "", [("get_weather", CALL_ARGS)]),
    ("llama3_json", f"<|python_tag|>{LCALL}", "", [("get_weather", CALL_ARGS)]),
    (
        "llama3_json",
        f" <|python_tag|>{LCALL}; {LCALL2}\n",
        "",
        [("get_weather", CALL_ARGS), ("get_time", CALL2_ARGS)],
    ),
    (
        "llama3_json",
        f"{LCALL}\nThat was the call.",
        "That was the call.",
        [("get_weather", CALL_ARGS)],
    ),
    (
        "llama3_json",
        '{"name": "f", "parameters": {"a": 1',
        '{"name": "f", "parameters": {"a": 1',
        [],
    ),
    ("llama3_json", '{"answer": 42}', '{"answer": 42}', []),
    ("llama3_json", '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
    ("llama3_json", "Call {this} later", "Call {this} later", []),
    ("llama3_json", "<|python_tag|>search('x')", "<|python_tag|>search('x')", []),
    ("mistral", "The answer is 42.", "The answer is 42.", []),
    ("mistral", f"[TOOL_CALLS] [{CALL}]", "", [("get_weather", CALL_ARGS)]),
    (
        "mistral",
        f"[TOOL_CALLS][{CALL}, {CALL2}]",
        "",
        [("get_weather", CALL_ARGS), ("get_time", CALL2_ARGS)],
    ),
    ("mistral", f"Checking.\n[TOOL_CALLS][{CALL}]", "Checking.", [("get_weather", CALL_ARGS)]),
    (
        "mistral",
        '[TOOL_CALLS]get_time[ARGS]{"zone": "CET"}[TOOL_CALLS]f[ARGS]{}',
        "",
        [("get_time", CALL2_ARGS), ("f", "{}")],
    ),
    ("mistral", '[TOOL_CALLS][{"name": 3}] x', '[TOOL_CALLS][{"name": 3}] x', []),
    ("mistral", f"[TOOL_CALLS][{CALL}", f"[TOOL_CALLS][{CALL}", []),
    ("mistral", "x [TOOL_CALL", "x [TOOL_CALL", []),
]
CASE_IDS = [f"{family}-{i}" for i, (family, *_) in enumerate(CASES)]


def streamed(family: str, pieces: list[str]) -> tuple[str, list[tuple[str, str]]]:
    stream = PARSERS[family]().stream()
    deltas = [d for piece in pieces for d in stream.feed(piece)] + stream.finish()
    content = ""
    calls: list[list[str]] = []
    for delta in deltas:
        if isinstance(delta, ContentDelta):
            assert delta.text, "an empty content delta"
            content += delta.text
            continue
        assert isinstance(delta, ToolCallDelta)
        if delta.index == len(calls):
            assert delta.id is not None and re.fullmatch(r"call_[0-9a-f]{24}", delta.id)
            assert delta.name
            calls.append([delta.id, delta.name, delta.arguments_fragment])
        else:
            assert delta.index == len(calls) - 1, "a fragment for a call already closed"
            assert delta.id is None and delta.name is None
            calls[-1][2] += delta.arguments_fragment
    assert [call.id for call in stream.tool_calls] == [call[0] for call in calls]
    return content, [(name, arguments) for _, name, arguments in calls]


def parsed(family: str, text: str) -> tuple[str, list[tuple[str, str]]]:
    output = PARSERS[family]().parse(text)
    for call in output.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
        json.loads(call.arguments)
    return output.content, [(call.name, call.arguments) for call in output.tool_calls]


@pytest.mark.parametrize("family,text,content,calls", CASES, ids=CASE_IDS)
def test_parse(family, text, content, calls):
    assert parsed(family, text) == (content, calls)


@pytest.mark.parametrize("family,text,content,calls", CASES, ids=CASE_IDS)
def test_every_split_point(family, text, content, calls):
    for cut in range(len(text) + 1):
        assert streamed(family, [text[:cut], text[cut:]]) == (content, calls), cut
    assert streamed(family, list(text)) == (content, calls)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CASES), st.lists(st.integers(0, 200), max_size=12))
def test_random_splits(case, cuts):
    family, text, content, calls = case
    bounds = sorted({min(cut, len(text)) for cut in cuts})
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    assert streamed(family, pieces) == (content, calls)


# Pieces a model may write, per family, that random outputs are built from.
PIECES = {
    "hermes": [
        "Hello",
        " ",
        "\n",
        "<",
        "<tool_call>",
        "</tool_call>",
        f"<tool_call>\n{CALL}\n</tool_call>",
        CALL2,
        "<tool_",
        '{"name": "x"}',
    ],
    "llama3_json": [" ", "\n", ";", "<|python_tag|>", LCALL, LCALL2, "{", "}", "text", "<|py"],
    "mistral": [
        "Hi",
        " ",
        "[",
        "[TOOL_CALLS]",
        f"[{CALL}]",
        CALL2,
        "get_time[ARGS]",
        "[ARGS]",
        "{}",
        "[TOOL_",
        "]",
    ],
}


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_built_outputs_stream_as_they_parse(data):
    family = data.draw(st.sampled_from(sorted(PIECES)))
    text = "".join(data.draw(st.lists(st.sampled_from(PIECES[family]), max_size=10)))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=15))
    bounds = sorted(set(cuts))
    pieces = [text[a:b] for a, b in zip([0, *bounds], [*bounds, len(text)])]
    assert streamed(family, pieces) == parsed(family, text)


@pytest.mark.parametrize(
    "family,start,marker",
    [("hermes", "Hi ", "<tool_"), ("llama3_json", "", "<|pyth"), ("mistral", "Hi ", "[TOOL_")],
)
def test_possible_markup_is_held_until_the_end(family, start, marker):
    stream = PARSERS[family]().stream()
    assert stream.feed(start + marker) == ([ContentDelta(start.strip())] if start else [])
    assert stream.finish() == [ContentDelta(start[len(start.strip()) :] + marker)]


def test_valid_call_markup_never_reaches_content():
    text = f"One <tool_call>\n{CALL}\n</tool_call> two"
    for cut in range(len(text) + 1):
        stream = PARSERS["hermes"]().stream()
        for piece in (text[:cut], text[cut:]):
            for delta in stream.feed(piece):
                assert not isinstance(delta, ContentDelta) or "tool_call" not in delta.text
        assert stream.finish() == []


def test_stream_is_single_use():
    stream = PARSERS["hermes"]().stream()
    stream.finish()
    with pytest.raises(RuntimeError, match="after finish"):
        stream.feed("x")


HERMES_TEMPLATE = (
    "{% if tools %}<tools>{{ tools }}</tools> reply in <tool_call></tool_call>{% endif %}"
)
LLAMA_TEMPLATE = "{% if tools %}{{ tools | tojson }}{% endif %}<|start_header_id|>ipython"


@pytest.mark.parametrize(
    "template,model_type,expected",
    [
        (HERMES_TEMPLATE, "qwen2", "hermes"),
        (HERMES_TEMPLATE, None, "hermes"),
        ("{{ messages }}", "qwen3", "hermes"),
        ("[INST]{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]", None, "mistral"),
        (None, "mistral", "mistral"),
        (LLAMA_TEMPLATE, "llama", "llama3_json"),
        ("<|python_tag|>", None, "llama3_json"),
        ("{% for m in messages %}{{ m.content }}{% endfor %}", "llama", None),
        ("{% if tools %}{{ tools }}{% endif %}", "llama", "llama3_json"),
        (None, "gpt2", None),
        (None, None, None),
    ],
)
def test_parser_for_detects_the_family(template, model_type, expected):
    assert parser_for(template, model_type) == expected


def test_parser_for_override():
    assert parser_for(HERMES_TEMPLATE, "qwen2", override="mistral") == "mistral"
    assert parser_for(None, None, override="llama3_json") == "llama3_json"
    with pytest.raises(ValueError, match="choose one of: hermes, llama3_json, mistral"):
        parser_for(HERMES_TEMPLATE, "qwen2", override="qwen")
