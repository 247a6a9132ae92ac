"""Structured outputs through the engine: on tiny random-weight models the grammar alone makes
the output valid (JSON schema, regex, choice, Lark grammar), and it composes with batching,
seeds, penalties, logprobs, stop strings, overlapped steps and preemption; a bad grammar is
refused by name (slow and aborted compiles: tests/test_structured_limits.py)."""

from __future__ import annotations

import json
import re
import threading

import jsonschema
import pytest
import torch

from engine import LLM, SamplingParams
from engine.structured import StructuredOutput
from engine.structured import pool as pool_module
from engine.structured.pool import GrammarPool

CONFIG = dict(max_model_len=128, max_num_batched_tokens=64, max_num_seqs=16)
TIGHT = dict(num_kv_blocks=12, max_num_batched_tokens=32)
"""12 blocks of 16 tokens for 8-16 requests of up to 70 tokens: preemption mid-output."""

SCHEMAS = [
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "size": {"enum": ["S", "M", "L"]},
        },
        "required": ["name", "size"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -9, "maximum": 9},
                    "y": {"type": "integer", "minimum": 0, "maximum": 99},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            },
            "flags": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
        },
        "required": ["point", "flags"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {
            "anyOf": [
                {"type": "string", "maxLength": 3},
                {"type": "integer", "minimum": 0, "maximum": 9},
                {"type": "null"},
            ]
        },
        "minItems": 2,
        "maxItems": 4,
    },
    {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
            "kind": {"const": "ticket"},
            "ok": {"type": "boolean"},
        },
        "required": ["code", "kind", "ok"],
        "additionalProperties": False,
    },
]


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(0, 256, (int(k),), generator=g).tolist() for k in range(3, 3 + n)]


def _llm(folder, overlap: bool = False, **config) -> LLM:
    """The CPU engine, with overlapped steps switched on by hand where asked (tests/
    test_overlap.py: on by default only on a GPU)."""
    llm = LLM(str(folder), device="cpu", **{**CONFIG, **config})
    llm.engine._overlap = overlap
    return llm


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return _llm(tiny_llama)


def _params(spec: StructuredOutput | None = None, **kw) -> SamplingParams:
    return SamplingParams(**{"max_tokens": 100, "temperature": 1.0, **kw}, structured=spec)


def _summary(outs) -> list[tuple]:
    return [(o.token_ids, o.finish_reason, o.stop_reason) for o in outs]


def _assert_drained(llm: LLM) -> None:
    """Nothing left running and every KV block back. With overlap the last step launched may
    still be in flight for requests that ended meanwhile: one more step drains it, silently."""
    engine = llm.engine
    for _ in range(2):
        if engine.has_unfinished():
            assert engine.step() == []
    assert not engine.has_unfinished() and engine.block_manager.num_used_blocks == 0


# --- each kind of grammar makes a random model's output valid ----------------------------------
@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s["type"])
def test_json_schema_outputs_validate_and_end_with_stop(llm, schema):
    spec = StructuredOutput.json_schema(schema)
    outs = llm.generate(_prompts(6), [_params(spec, seed=s) for s in range(6)])
    for o in outs:
        jsonschema.validate(json.loads(o.text), schema)
        assert o.finish_reason == "stop" and o.stop_reason is None, o.text
    assert len({o.text for o in outs}) > 1  # seeds differ: the weights pick, the grammar bounds
    _assert_drained(llm)


def test_json_object_is_an_object(llm):
    """Keys and values are unbounded here, so a random model may run to max_tokens; whatever
    stops is an object."""
    spec = StructuredOutput("json_object")
    outs = llm.generate(_prompts(8), [_params(spec, seed=s) for s in range(8)])
    stopped = [o for o in outs if o.finish_reason == "stop"]
    assert len(stopped) >= 4, [(o.text, o.finish_reason) for o in outs]
    assert all(isinstance(json.loads(o.text), dict) for o in stopped)
    assert all(o.text.startswith("{") for o in outs)


def test_regex_output_matches_in_full(llm):
    pattern = r"[a-c]{3}-[0-9]{2,4}(!|\?)"
    outs = llm.generate(
        _prompts(6), [_params(StructuredOutput("regex", pattern), seed=s) for s in range(6)]
    )
    for o in outs:
        assert re.fullmatch(pattern, o.text), o.text
        assert o.finish_reason == "stop"


def test_choice_is_one_of_the_options_and_stops_at_once(llm):
    options = ["yes", "no", "maybe later"]
    spec = StructuredOutput.choice(options)
    outs = llm.generate(_prompts(8), [_params(spec, seed=s) for s in range(8)])
    assert all(o.text in options for o in outs), [o.text for o in outs]
    assert all(o.finish_reason == "stop" and o.stop_reason is None for o in outs)
    assert all(len(o.token_ids) <= len(max(options, key=len)) for o in outs)  # no tail after it
    assert len({o.text for o in outs}) > 1


def test_lark_grammar_with_embedded_json(llm):
    grammar = (
        'start: "SELECT " col ("," col)? " FROM " table " LIMIT " n\n'
        'col: "id" | "name" | "age"\n'
        "table: /[a-z]{1,6}/\n"
        'n: %json {"type": "integer", "minimum": 1, "maximum": 50}\n'
    )
    shape = r"SELECT (id|name|age)(,(id|name|age))? FROM [a-z]{1,6} LIMIT (?P<n>[0-9]+)"
    outs = llm.generate(
        _prompts(5), [_params(StructuredOutput("grammar", grammar), seed=s) for s in range(5)]
    )
    for o in outs:
        m = re.fullmatch(shape, o.text)
        assert m and 1 <= int(m["n"]) <= 50, o.text
        assert o.finish_reason == "stop"


def test_a_grammar_still_open_at_max_tokens_ends_with_length(llm):
    out = llm.generate(_prompts(1), _params(StructuredOutput("regex", "[a-z]{30}"), max_tokens=5))[
        0
    ]
    assert out.finish_reason == "length" and re.fullmatch("[a-z]{5}", out.text)


# --- composing with batching, seeds, penalties, logprobs, stop strings -------------------------
def _mixed_batch() -> list[SamplingParams]:
    """Constrained and free requests side by side, seeded so each has one right answer."""
    return [
        _params(StructuredOutput.json_schema(SCHEMAS[0]), seed=1),
        _params(None, max_tokens=20, seed=2, ignore_eos=True),
        _params(StructuredOutput("regex", "[a-z]{8,20}"), seed=3, temperature=0.0),
        _params(None, max_tokens=15, temperature=0.0, ignore_eos=True),
        _params(StructuredOutput.json_schema(SCHEMAS[1]), seed=4, repetition_penalty=1.3),
        _params(None, max_tokens=18, seed=5, frequency_penalty=0.5, ignore_eos=True),
        _params(StructuredOutput.choice(["red", "green", "blue"]), seed=6, logprobs=2),
        _params(StructuredOutput.json_schema(SCHEMAS[2]), seed=7, presence_penalty=1.0),
    ]


def _assert_mixed_valid(outs) -> None:
    params = _mixed_batch()
    for o, p in zip(outs, params):
        spec = p.structured
        if spec is None:
            assert o.finish_reason == "length" and len(o.token_ids) == p.max_tokens
        elif spec.kind == "json_schema":
            jsonschema.validate(json.loads(o.text), json.loads(spec.value))
        elif spec.kind == "regex":
            assert re.fullmatch(spec.value, o.text)
        else:
            assert o.text in json.loads(spec.value)


def test_free_requests_beside_constrained_ones_are_unchanged(llm):
    params = _mixed_batch()
    prompts = _prompts(len(params))
    together = llm.generate(prompts, params)
    _assert_mixed_valid(together)
    for i, p in enumerate(params):
        if p.structured is None:
            alone = llm.generate([prompts[i]], p)[0]
            assert together[i].token_ids == alone.token_ids
    again = llm.generate(prompts, params)  # same seeds, same outputs
    assert _summary(again) == _summary(together)


def test_several_samples_of_one_prompt_differ_by_seed_and_repeat_with_it(llm):
    spec = StructuredOutput.json_schema(SCHEMAS[3])
    prompt = _prompts(1) * 4
    first = llm.generate(prompt, [_params(spec, seed=s) for s in (11, 12, 13, 11)])
    assert first[0].token_ids == first[3].token_ids
    assert len({tuple(o.token_ids) for o in first}) >= 2
    for o in first:
        jsonschema.validate(json.loads(o.text), SCHEMAS[3])


def test_penalties_and_logprobs_with_a_grammar(llm):
    spec = StructuredOutput.json_schema(SCHEMAS[1])
    params = [
        _params(spec, seed=s, logprobs=3, repetition_penalty=1.5, frequency_penalty=1.0)
        for s in range(4)
    ]
    for o in llm.generate(_prompts(4), params):
        jsonschema.validate(json.loads(o.text), SCHEMAS[1])
        assert [lp.token_id for lp in o.logprobs] == o.token_ids
        for lp in o.logprobs:
            assert lp.logprob <= 0.0 and lp.logprob > float("-inf")
            assert len(lp.top) == 3


def test_a_stop_string_cuts_a_constrained_output(llm):
    spec = StructuredOutput("regex", "[a-h]{16}")
    full = llm.generate(_prompts(1), _params(spec, temperature=0.0))[0]
    assert re.fullmatch("[a-h]{16}", full.text)
    stop = full.text[6]
    out = llm.generate(_prompts(1), _params(spec, temperature=0.0, stop=[stop]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text.split(stop)[0]


def test_grammar_starts_after_the_given_text(llm):
    """A reasoning model's "</think>": tokens before it are free (exactly the unconstrained
    ones), the grammar applies from the token after it."""
    free = llm.generate(
        _prompts(1), _params(None, max_tokens=40, temperature=0.0, ignore_eos=True)
    )[0]
    at = next(i for i, t in enumerate(free.token_ids) if i > 0 and 0x21 <= t <= 0x7E)
    marker = chr(free.token_ids[at])
    spec = StructuredOutput("regex", "[0-9]{3}", start_after=marker)
    out = llm.generate(_prompts(1), _params(spec, max_tokens=40, temperature=0.0))[0]
    assert out.token_ids[: at + 1] == free.token_ids[: at + 1]
    rest = bytes(out.token_ids[at + 1 :]).decode()
    assert re.fullmatch("[0-9]{3}", rest) and out.finish_reason == "stop"


def test_the_trace_reports_compile_and_mask_time(llm):
    out = llm.generate(_prompts(1), _params(StructuredOutput.json_schema(SCHEMAS[0]), seed=1))[0]
    events = [e.event for e in out.trace]
    assert events.index("grammar_compiling") < events.index("grammar_compiled")
    summary = next(e.detail for e in out.trace if e.event == "grammar")
    assert summary["kind"] == "json_schema" and summary["compile_ms"] >= 0
    assert summary["mask_steps"] == len(out.token_ids) == summary["tokens_accepted"]


# --- overlapped steps and preemption ------------------------------------------------------------
def _long_constrained() -> list[SamplingParams]:
    """Outputs of 40-60 tokens each, so 8 of them outgrow a 12-block pool mid-output."""
    return [
        _params(StructuredOutput("regex", "[a-z]{40}"), seed=1),
        _params(
            StructuredOutput.json_schema(
                {"type": "array", "items": {"enum": [1, 22, 333]}, "minItems": 12, "maxItems": 14}
            ),
            seed=2,
        ),
        _params(StructuredOutput("regex", "[0-9 ]{50}"), seed=3, temperature=0.0),
        _params(None, max_tokens=45, seed=4, ignore_eos=True),
        _params(StructuredOutput("regex", "([a-z]{1,3},){15}"), seed=5),
        _params(StructuredOutput("regex", "[A-Z]{45}"), seed=6, logprobs=1),
        _params(None, max_tokens=40, temperature=0.0, ignore_eos=True),
        _params(StructuredOutput("regex", "[xyz]{60}"), seed=8),
    ]


def _preempted_mid_output(out) -> bool:
    events = [e.event for e in out.trace]
    return "preempted" in events and events.index("first_token") < (
        len(events) - 1 - events[::-1].index("preempted")
    )


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
def test_preemption_mid_output_gives_the_same_tokens(tiny_llama, overlap):
    params = _long_constrained()
    prompts = _prompts(len(params))
    roomy = _llm(tiny_llama, overlap).generate(prompts, params)
    tight_llm = _llm(tiny_llama, overlap, **TIGHT)
    tight = tight_llm.generate(prompts, params)
    assert _summary(tight) == _summary(roomy)
    assert any(
        p.structured is not None and _preempted_mid_output(o) for o, p in zip(tight, params)
    ), "no constrained request was preempted after its first token"
    for o, p in zip(tight, params):
        spec = p.structured
        if spec is not None and spec.kind == "regex":
            assert re.fullmatch(spec.value, o.text) and o.finish_reason == "stop"
    _assert_drained(tight_llm)


@pytest.mark.parametrize("penalties", [False, True], ids=["no-penalties", "penalties"])
@pytest.mark.parametrize("pool", [None, TIGHT], ids=["roomy", "preempting"])
def test_overlapped_steps_equal_the_plain_loop(tiny_llama, pool, penalties):
    """Penalties read the pending tokens back before the forward (no overlap in that step)."""
    params = [p for p in _mixed_batch() + _long_constrained() if penalties or not p.has_penalties]
    prompts = _prompts(len(params))
    config = {} if pool is None else TIGHT
    plain = _llm(tiny_llama, False, **config).generate(prompts, params)
    overlapped_llm = _llm(tiny_llama, True, **config)
    overlapped = overlapped_llm.generate(prompts, params)
    assert _summary(overlapped) == _summary(plain)
    _assert_drained(overlapped_llm)


def test_masks_filled_on_the_mask_thread_give_the_plain_loop_tokens(tiny_llama, monkeypatch):
    """Every constrained step's masks on the mask thread (as a large batch's are), while the
    engine's thread reports tokens and prepares the next forward."""
    threads = []
    fill = GrammarPool._fill
    monkeypatch.setattr(pool_module, "THREAD_MIN_ROWS", 1)
    monkeypatch.setattr(
        GrammarPool, "_fill", lambda *a: threads.append(threading.current_thread().name) or fill(*a)
    )
    params = [p for p in _mixed_batch() + _long_constrained() if not p.has_penalties]
    prompts = _prompts(len(params))
    plain = _llm(tiny_llama, False).generate(prompts, params)
    on_thread = len(threads)  # the plain loop fills inline
    overlapped_llm = _llm(tiny_llama, True)
    overlapped = overlapped_llm.generate(prompts, params)
    assert _summary(overlapped) == _summary(plain)
    assert threads[on_thread:] and all(t.startswith("grammar-mask") for t in threads[on_thread:])
    _assert_drained(overlapped_llm)


# --- bad grammars ----------------------------------------------------
@pytest.mark.parametrize(
    "spec, words",
    [
        (StructuredOutput.json_schema({"not": {"type": "string"}}), ["not"]),
        (StructuredOutput.json_schema({"if": {}, "then": {}}), ["if", "then"]),
        (StructuredOutput.json_schema({"type": "strin"}), ["strin"]),
        (StructuredOutput.json_schema({"type": "string", "format": "colour"}), ["colour"]),
        (StructuredOutput("json_schema", "{not json"), ["not valid JSON"]),
        (StructuredOutput("regex", "(unclosed"), ["unclosed"]),
        (StructuredOutput("grammar", "start: missing_rule"), ["missing_rule"]),
        (StructuredOutput.choice([]), ["choice"]),
    ],
    ids=["not", "if-then", "type", "format", "json", "regex", "lark", "choice"],
)
def test_a_bad_grammar_is_refused_naming_the_reason(llm, spec, words):
    params = _params(spec)
    with pytest.raises(ValueError) as err:
        llm.engine.check_structured(params)
    assert all(w in str(err.value) for w in words), str(err.value)
    with pytest.raises(ValueError):
        llm.generate(_prompts(2), [_params(None), params])  # all or nothing
    _assert_drained(llm)


def test_a_bad_grammar_queued_directly_ends_its_request_only(llm):
    engine = llm.engine
    engine.add_request("bad", _prompts(1)[0], _params(StructuredOutput.json_schema({"not": {}})))
    engine.add_request("good", _prompts(1)[0], _params(StructuredOutput.choice(["a", "b"])))
    final = {}
    while engine.has_unfinished():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert final["bad"].finish_reason == "abort" and "not" in final["bad"].stop_reason
    assert final["bad"].token_ids == []
    assert final["good"].finish_reason == "stop" and final["good"].text in ("a", "b")


# --- the embedded model: real BPE tokens, several bytes each ------------------------------------
def test_embedded_model_outputs_follow_their_grammars():
    llm = LLM(device="cpu", max_model_len=256, max_num_seqs=4)
    schema = {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "London", "Rome"]},
            "population_millions": {"type": "integer", "minimum": 0, "maximum": 40},
        },
        "required": ["city", "population_millions"],
        "additionalProperties": False,
    }
    convo = [{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}]
    prompt = llm.engine.apply_chat_template(convo)
    specs = [
        StructuredOutput.json_schema(schema),
        StructuredOutput("regex", r"[0-9]{4}-[0-9]{2}-[0-9]{2}"),
        StructuredOutput.choice(["Paris", "Lyon"]),
    ]
    outs = llm.generate([prompt] * 3, [_params(s, max_tokens=40, temperature=0.0) for s in specs])
    jsonschema.validate(json.loads(outs[0].text), schema)
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", outs[1].text)
    assert outs[2].text == "Paris"  # the model knows it; the grammar only bounds the form
    assert all(o.finish_reason == "stop" for o in outs)
    assert len(outs[0].token_ids) < len(outs[0].text)  # multi-character tokens were masked
