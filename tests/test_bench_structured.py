"""benchmarks/bench_structured.py on the CPU: the smoke run end to end (tiny layers, the embedded
tokenizer), and the hand-written check of constrained outputs, which must catch a broken one."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks import bench_structured
from benchmarks.structured_schemas import RECORDS_JSON, TOOL_CALL_TEXT, is_valid_prefix

VALID = {
    "records": [
        {"id": 0, "name": 'a"b\\c\u00e9\n', "tag": "red", "ok": True},
        {"id": 99999, "name": "", "tag": "blue", "ok": False},
    ]
}


def test_every_beginning_of_a_valid_instance_passes_the_check():
    text = json.dumps(VALID)
    assert RECORDS_JSON.fullmatch(text) is not None
    assert all(is_valid_prefix(text[:k]) for k in range(len(text) + 1))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"red"', '"pink"'),  # not in the enum
        ("99999", "100000"),  # above the maximum
        ('"name": ""', '"name": "' + "x" * 13 + '"'),  # longer than maxLength
        (', "ok": false', ""),  # a required property missing
        ('"id": 0', '"id": 01'),  # not JSON
        ('{"records": [', '{"records":['),  # not the engine's separators
        ('"tag": "blue"', '"ok": false, "tag": "blue"'),  # out of schema order
    ],
)
def test_the_check_catches_a_broken_output(old, new):
    text = json.dumps(VALID)
    assert old in text
    assert not is_valid_prefix(text.replace(old, new, 1))


CALL = (
    '<tool_call>\n{"name": "write_files", "arguments": {"files": ['
    '{"path": "a/b.py", "content": "print(\\"hi\\")\\n"}, {"path": "", "content": ""}]}}'
    "\n</tool_call>"
)


def test_every_beginning_of_a_forced_call_passes_and_a_broken_one_does_not():
    assert TOOL_CALL_TEXT.fullmatch(CALL) is not None
    assert all(is_valid_prefix(CALL[:k], "tool") for k in range(len(CALL) + 1))
    for old, new in [
        ("write_files", "read_file"),  # not the forced function
        ('"path": ""', '"name": ""'),  # not the tool's schema
        ('"content": ""}', '"content": "", "mode": 1}'),  # a property the tool does not have
        ("\n</tool_call>", "</tool_call>"),  # not Hermes markup
    ]:
        assert old in CALL
        assert not is_valid_prefix(CALL.replace(old, new, 1), "tool")


def test_short_or_broken_outputs_are_problems():
    class Tok:
        def decode(self, ids):
            return {1: '{"records": [{"id": ', 2: '{"records": {'}[ids[0]]

    def out(rid, ids):
        return SimpleNamespace(
            request_id=rid, token_ids=ids, finish_reason="stop", stop_reason=None
        )

    waves = [
        {"arm": "json_schema", "outputs": [out("good", [1, 1]), out("bad", [2, 2])]},
        {"arm": "json_schema", "outputs": [out("short", [1])]},
        {"arm": "unconstrained", "outputs": [out("free", [2, 2])]},
    ]
    problems = bench_structured.check_outputs(waves, 2, Tok(), "records")
    assert len(problems) == 2
    assert problems[0].startswith("bad broke the schema")
    assert problems[1].startswith("short ended after 1 of 2 tokens")


def test_smoke_run_end_to_end(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny shapes: threads only add overhead on a busy CI box
    try:
        rc = bench_structured.main(["--smoke", "--out", str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    r = json.loads((tmp_path / "bench_structured.json").read_text())
    assert rc == 0 and r["problems"] == []
    sizes = bench_structured.DEFAULTS["smoke"]
    rounds, max_tokens, c = sizes["rounds"], sizes["max_tokens"], sizes["concurrency"]
    for phase, batch in (("batch1", 1), ("concurrent", c)):
        for arm in ("unconstrained", "json_schema"):
            figures = r[phase][arm]
            assert figures["requests"] == 2 * rounds * batch  # A B B A: two turns per round
            assert figures["output_tokens"] == figures["requests"] * max_tokens
            assert figures["out_tok_s"] > 0 and figures["tpot_p50_s"] > 0
        grammar = r[phase]["json_schema"]["grammar"]
        assert grammar["mask_steps_p50"] == max_tokens  # every token was masked
        assert 0 < grammar["mask_ms_mean_p50"] <= grammar["mask_ms_max"]
        assert r[phase]["verdict"] in ("pass", "miss")
    unconstrained = r["batch1"]["unconstrained"]["tpot_p50_s"]
    schema = r["batch1"]["json_schema"]["tpot_p50_s"]
    assert r["batch1"]["tpot_loss_pct"] == pytest.approx((schema / unconstrained - 1) * 100)
    compiled = r["compile"]
    assert compiled["properties"] == 50 and compiled["backends"] == sizes["compile_repeats"]
    assert 0 < compiled["cached_ms"] < compiled["first_ms"]  # the cache skips the compile
    shown = capsys.readouterr().out
    assert "| batch 1: TPOT p50" in shown and f"| {c} concurrent: out tok/s" in shown
