"""The dashboard's pure parts and its wiring: value formatting, request rows (state, sort,
filter), the timeline bar, `appliance top` on the command line, `serve --tui` in one process
with its log panel, and the rule that tui/ never imports torch or the engine."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

import tui
from appliance.cli import main
from appliance.serve import serve_tui
from appliance.server.records import STRUCTURED_KINDS
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine
from tests.support.tui_fakes import make_doc
from tests.support.tui_screen import screen_text, wait_for
from tests.support.tui_trace_fakes import make_trace
from tui import format as fmt
from tui import model
from tui.screens.trace import grammar_line, spec_line, summary
from tui.widgets.kv import hit_cells, state_cell
from tui.widgets.queue import spec_cell
from tui.widgets.timeline import bar


def test_formatting_and_na():
    assert [fmt.seconds(v) for v in (0.0004, 0.0123, 0.5, 1.234, 42.0, 245.0)] == [
        "400us",
        "12.3ms",
        "500ms",
        "1.23s",
        "42.0s",
        "4m05s",
    ]
    assert fmt.uptime(3723) == "1h02m03s" and fmt.uptime(90000) == "1d01h"
    for value in (None, "x", float("nan"), True):
        assert fmt.seconds(value) == fmt.unit(value, " W") == fmt.gib(value) == "n/a"
    assert fmt.gauge(0.5, 10) == "█████░░░░░" and fmt.rate(12345) == "12.3k"


def test_rows_state_sort_and_filter():
    rows = model.rows(make_doc(0))
    states = {r.id: r.state for r in rows}
    assert states["req-wait-d"] == "waiting" and states["req-run-a"] == "running"
    assert states["req-err-g"] == "timeout"
    assert {r.id: r.finish for r in rows}["req-err-g"] == "504"
    by_kv = model.select(rows, "", "kv", reverse=False)
    assert [r.id for r in by_kv[:3]] == ["req-run-a", "req-run-c", "req-run-b"]
    assert [r.id for r in model.select(rows, "", "live", False)] == [r.id for r in rows]
    assert {r.id for r in model.select(rows, "Run", "live", False)} == {
        "req-run-a",
        "req-run-b",
        "req-run-c",
    }
    assert model.select(rows, "nothing", "live", False) == []


def test_out_column_marks_structured_and_tool_requests():
    rows = {r.id: r for r in model.rows(make_doc(0))}
    assert (rows["req-run-b"].out, rows["req-done-f"].out, rows["req-done-h"].out) == (
        "json",
        "call",
        "tool",
    )
    assert rows["req-run-a"].out == "" and rows["req-done-e"].out == ""
    assert set(model.OUT_MARKS) == set(STRUCTURED_KINDS)  # a mark for every kind the server names
    assert len(set(model.OUT_MARKS.values()) | {model.TOOLS_MARK}) == len(STRUCTURED_KINDS) + 1
    assert model.out_mark({"structured": "regex", "tools": True}) == "rx+t"
    assert model.out_mark({"structured": "tool_call", "tools": True}) == "call"
    assert model.out_mark({"structured": "ebnf_v2"}) == "ebnf"  # a kind this dashboard predates
    assert model.out_mark({}) == ""  # a server that predates the keys
    every = list(rows.values())
    assert [r.id for r in model.select(every, "json", "live", False)] == ["req-run-b"]
    assert [r.id for r in model.select(every, "tool", "live", False)] == ["req-done-h"]
    assert [r.id for r in model.select(every, "", "out", False)][:3] == [
        "req-done-h",
        "req-run-b",
        "req-done-f",
    ]


def test_out_and_cached_columns_only_in_a_wide_table():
    row = model.rows(make_doc(0))[1]
    assert model.columns(wide=True) == model.COLUMNS and "out" in model.COLUMNS
    narrow = model.columns(wide=False)
    assert "out" not in narrow and "cached" not in narrow
    assert len(narrow) == len(model.COLUMNS) - len(model.WIDE_ONLY)
    assert row.cells(24)[:3] == ("req-run-b", "running", "json")
    assert row.cells(8, narrow)[:3] == ("req-run…", "running", "300")


def test_cached_column_and_sort():
    rows = {r.id: r for r in model.rows(make_doc(0))}
    wide = model.columns(wide=True)
    cells = dict(zip(wide, rows["req-run-a"].cells(24, wide), strict=True))
    assert (cells["prompt"], cells["cached"]) == ("900", "768")
    assert cells["img"] == "2"  # the prompt's images
    by_cached = model.select(list(rows.values()), "", "cached", reverse=False)
    assert [r.id for r in by_cached[:3]] == ["req-run-a", "req-done-e", "req-done-h"]
    assert model.rows({"requests": [{"id": "x"}]})[0].cells(8, ("cached",)) == ("n/a",)


def test_kv_panel_hit_rate_cells():
    view = model.History().push(make_doc(2))
    assert hit_cells(view) == ("hit   48%", " 98 cached")
    cache = view.doc["kv"]["prefix_cache"]
    cache["hit_rate_perc"] = None  # nothing looked up in the last minute
    assert hit_cells(view) == ("hit   n/a", " 98 cached")
    cache["enabled"] = False
    assert hit_cells(view) == ("hit   off", "")
    del view.doc["kv"]["prefix_cache"]  # a server that does not say
    assert hit_cells(view) == ("hit   n/a", "")


def test_kv_panel_state_slots_cell():
    view = model.History().push(make_doc(2))
    assert state_cell(view) == ""  # a model without linear-attention layers keeps no state
    view.doc["engine"].update(state_slots_used=3, state_slots_total=64)
    assert state_cell(view) == " · state 3/64 slots"
    view.doc["engine"].update(state_slots_used=None, state_slots_total=None)
    assert state_cell(view) == ""


def test_queue_panel_spec_cell():
    """k and acceptance only where speculation is on; `spec off` otherwise."""
    assert spec_cell(model.History().push(make_doc(2))) == "spec off"
    view = model.History().push(make_doc(0, spec=True))
    assert spec_cell(view) == "spec k=4 · accept 62% · 2.48/draft"
    view.doc["config"]["num_speculative_tokens"] = None  # k left to the engine
    view.doc["engine"]["spec_decode"]["k"] = 3  # its last choice
    assert spec_cell(view).startswith("spec k=3 · accept 62%")
    del view.doc["engine"]["spec_decode"]["k"]  # an engine that does not say
    assert spec_cell(view).startswith("spec k=auto · accept 62%")
    view.doc["engine"]["spec_decode"].update(acceptance_rate=None, mean_accepted_length=None)
    assert spec_cell(view) == "spec k=auto · accept n/a · n/a/draft"  # nothing drafted yet
    view.doc["engine"]["spec_decode"] = None  # a model the engine turns speculation off for
    assert spec_cell(view) == "spec off"
    del view.doc["config"]["speculative"]  # a server that does not say
    assert spec_cell(view) == ""


def test_trace_spec_line_sums_the_spec_events():
    assert spec_line(make_trace("req-done-e")) is None
    trace = make_trace("req-done-e", spec=True)
    assert spec_line(trace) == "speculative: drafted 120 · accepted 74 (62%)"
    assert spec_line(trace) in summary(trace).plain
    second = {"event": "spec", "choice": 1, "detail": {"drafted": 80, "accepted": 6}}
    trace["events"].append(second)
    assert spec_line(trace) == "speculative: drafted 200 · accepted 80 (40%)"


def test_trace_summary_shows_cached_tokens():
    text = summary(make_trace("req-done-e")).plain
    assert "prompt 500 · cached 256 · gen 256" in text
    assert "cached n/a" in summary({"prompt_tokens": 3}).plain


def test_trace_grammar_line_sums_the_choices():
    """Mask time per step is weighted by each choice's steps; the compile is the slowest."""
    trace = make_trace("req-run-b")
    g0 = {"compile_ms": 1.0, "mask_steps": 30, "mask_ms_mean": 0.04, "mask_ms_max": 0.2}
    g1 = {"compile_ms": 2.5, "mask_steps": 10, "mask_ms_mean": 0.08, "mask_ms_max": 0.9}
    trace["choices"] = [{"grammar": g0}, {"grammar": g1}, {"grammar": None}]
    assert grammar_line(trace) == (
        "grammar json_schema · compile check 1.2ms · engine compile 2.5ms · "
        "mask 50us/step (max 900us, 40 steps)"
    )
    assert grammar_line(make_trace("req-done-e")) is None
    assert grammar_line({**make_trace("req-done-h"), "choices": []}) == "no grammar · tools sent"
    unfinished = {"structured": "regex", "grammar_compile_s": None, "choices": [{"grammar": None}]}
    assert grammar_line(unfinished) == "grammar regex"


def test_history_keeps_the_last_samples():
    history = model.History(size=3)
    for step in range(5):
        view = history.push(make_doc(step))
    assert view.waiting == (3.0, 1.0, 2.0) and len(view.kv_perc) == 3
    assert view.hit_perc == (48.0, 52.0, 56.0)
    missing = history.push({"kv": {"prefix_cache": {"hit_rate_perc": None}}})
    assert missing.hit_perc == (52.0, 56.0, 0.0)
    assert view.get("engine", "missing", "deeper") is None


def test_timeline_bar_marks_phases_and_preemption():
    events = [e for e in make_trace()["events"] if e["source"] == "engine"]
    line = bar(events, 3200.0, 64)
    assert len(line) == 64 and line.count("X") == 1 and line.count("|") == 2
    assert line.index("X") < line.rindex("▒") < line.rindex("|")  # re-prefill after preemption
    assert line.endswith("█ ") or line.endswith("██")


def test_tui_never_imports_torch_or_the_engine():
    code = (
        "import sys, tui, tui.app, tui.screens.trace; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'engine'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_top_needs_a_terminal_and_has_help(capsys):
    assert main(["top", "--url", "http://127.0.0.1:9"]) == 2
    assert "needs a terminal" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["top", "--help"])
    assert "--api-key" in capsys.readouterr().out


async def test_serve_tui_runs_server_and_dashboard_in_one_process(tmp_path, monkeypatch):
    """The dashboard reads its own server over loopback; log lines reach the panel; q drains."""
    seen: dict = {}
    real_create = tui.create_app

    def create(*args, **kwargs):
        app = real_create(*args, **kwargs)

        async def run_async():
            async with app.run_test(size=(100, 40)) as pilot:
                await wait_for(
                    pilot, lambda: app.view is not None and app.view.doc["status"] == "ok"
                )

                def logged() -> bool:
                    # Keep the very frame that showed the log lines: a later render can
                    # catch the screen between two layouts.
                    seen["text"] = screen_text(app)
                    return "serving at" in seen["text"]

                await wait_for(pilot, logged, timeout=3, what="log line")
                await pilot.press("q")

        app.run_async = run_async
        return app

    monkeypatch.setattr(tui, "create_app", create)
    logging.getLogger("appliance.server").setLevel(logging.INFO)
    log = tmp_path / "serve.log"
    settings = ServeSettings(port=0, tui=True, log_file=str(log), warmup=False)
    assert await serve_tui(settings, None, FakeEngine) == 0
    assert "fake-model (params n/a) on cpu" in seen["text"] and f"Log · {log}" in seen["text"]
    assert "startup: loading the model" in seen["text"]
