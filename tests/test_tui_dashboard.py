"""The dashboard driven with Textual's Pilot against a fake stats server: panels update, the
request table sorts and filters, Enter opens a trace, pause, help, the plan screen, API keys,
and a server that goes away and comes back."""

from __future__ import annotations

import pytest
from textual.widgets import DataTable

from tests.support.tui_fakes import T0, make_doc
from tests.support.tui_screen import screen_text, wait_for
from tests.support.tui_sources import FakeStatsServer
from tests.support.tui_trace_fakes import make_trace
from tui import create_app
from tui.screens.help import HelpScreen
from tui.screens.plan import PlanScreen
from tui.screens.trace import TraceScreen

SIZE = (120, 40)


@pytest.fixture
async def server():
    srv = FakeStatsServer([make_doc(0)])
    await srv.start()
    yield srv
    await srv.stop()


def app_for(server: FakeStatsServer, **kwargs):
    return create_app(server.url, clock=lambda: T0 + 5000, retry_s=0.05, **kwargs)


def table_ids(app) -> list[str]:
    table = app.main.query_one("#requests-table", DataTable)
    return [key.value for key in table.rows]


def uptime_is(app, seconds: float) -> bool:
    return app.view is not None and app.view.doc["uptime_s"] == seconds


async def test_panels_show_the_stats_and_follow_updates(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3723.0), what="first document")
        await pilot.pause()
        text = screen_text(app)
        assert "SmolLM2-135M-Instruct (135M params) on cuda:0 · weights bfloat16 · KV auto" in text
        assert "max_model_len 2048 · max_num_seqs 16 · up 1h02m03s" in text
        assert " OK  SmolLM2-135M-Instruct (135M params) on cuda:0" in text
        assert "113/512 blocks · preempted 3" in text and "22.1%" in text
        assert "largest 3 hold 100% of used" in text and "req-run… 57%" in text
        assert "hit   40%" in text and " 96 cached" in text
        assert "prompt  cached  gen" in text  # the wide table's cached column
        assert "waiting    1" in text and "running    3" in text
        assert "rejected (429) 7 · timed out 1" in text
        assert "tok/s prompt 1834  gen 412" in text
        assert "TTFT   45.0ms   110ms   1.50s" in text
        assert "NVIDIA H200" in text and "util     87%   SM 1980 MHz" in text
        assert "power  512 W   temp 61 C" in text and "120.0 GiB / 141.0 GiB" in text
        assert table_ids(app)[:4] == ["req-run-a", "req-run-b", "req-run-c", "req-wait-d"]

        server.docs.append(make_doc(1, gpu=False))
        await wait_for(pilot, lambda: uptime_is(app, 3724.0), what="second document")
        await pilot.pause()
        text = screen_text(app)
        assert "118/512 blocks" in text and "up 1h02m04s" in text
        assert "util     n/a   SM n/a" in text and "no GPU readings from the server" in text
        assert app.view.kv_perc == pytest.approx((100 * 113 / 512, 100 * 118 / 512))
        assert app.view.hit_perc == (40.0, 44.0) and "hit   44%" in text


async def test_sort_cycles_and_reverses_and_filter_keeps_a_state(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(table_ids(app)) == 8, what="the request rows")
        panel = app.main.requests
        while panel.sort != "kv":
            await pilot.press("s")
        assert table_ids(app)[:3] == ["req-run-a", "req-run-c", "req-run-b"]
        assert "sort kv ↓" in screen_text(app)
        await pilot.press("S")
        assert table_ids(app)[-3:] == ["req-run-b", "req-run-c", "req-run-a"]
        assert "sort kv ↑" in screen_text(app)
        while panel.sort != "ttft":
            await pilot.press("s")
        assert table_ids(app)[0] in ("req-wait-d", "req-done-f")  # smallest first (n/a = 0)
        assert table_ids(app)[-1] == "req-err-g"

        await pilot.press("slash", *"wait")
        assert table_ids(app) == ["req-wait-d"]
        await pilot.press("enter")
        assert "filter 'wait'" in screen_text(app)
        assert isinstance(app.focused, DataTable)
        await pilot.press("slash", "backspace", "backspace", "backspace", "backspace", *"fin")
        assert set(table_ids(app)) == {"req-done-e", "req-done-f", "req-done-h"}
        await pilot.press("escape")
        assert len(table_ids(app)) == 8 and panel.state_filter == ""


async def test_enter_opens_the_trace_timeline(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(table_ids(app)) == 8, what="the request rows")
        table = app.main.query_one("#requests-table", DataTable)
        table.move_cursor(row=table_ids(app).index("req-done-e"))
        await pilot.press("enter")
        assert isinstance(app.screen, TraceScreen)
        await wait_for(pilot, lambda: app.screen.trace is not None, what="the trace")
        await pilot.pause()
        text = screen_text(app)
        assert "Trace of request req-done-e" in text
        assert "finished (length)" in text and "preemptions 2" in text
        bar = next(line for line in text.splitlines() if "choice 0" in line)
        assert "X" in bar and "|" in bar and "▒" in bar and "█" in bar and "░" in bar
        assert bar.index("▒") < bar.index("|") < bar.index("X")  # prefill, first token, preempted
        assert app.screen.query_one("#trace-events", DataTable).row_count == 14
        assert "prefill_chunk" in text and '{"tokens":244,"start":256}' in text
        await pilot.press("escape")
        assert app.screen is app.main


async def test_structured_and_tool_requests_are_marked_and_their_trace_shows_the_grammar(
    server,
):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(table_ids(app)) == 8, what="the request rows")
        await pilot.pause()
        lines = screen_text(app).splitlines()
        row = {rid: next(x for x in lines if f" {rid} " in x).split() for rid in table_ids(app)}
        assert row["req-run-b"][:4] == ["req-run-b", "running", "json", "300"]
        assert row["req-done-f"][:4] == ["req-done-f", "finished", "call", "64"]
        assert row["req-done-h"][:4] == ["req-done-h", "finished", "tool", "220"]
        assert row["req-done-e"][:3] == ["req-done-e", "finished", "500"]  # unconstrained
        app.open_trace("req-done-f")
        await wait_for(pilot, lambda: app.screen.trace is not None, what="the trace")
        await pilot.pause()
        text = screen_text(app)
        assert (
            "grammar tool_call · tools sent · compile check 1.2ms · engine compile 1.1ms · "
            "mask 48us/step (max 210us, 12 steps)"
        ) in text
        assert "grammar_compiled" in text and '"mask_steps":12' in text  # the event list


async def test_speculative_decoding_k_acceptance_and_a_traces_drafts(server):
    """Off: `spec off` in the Queue panel; on: k, acceptance and accepted tokens a draft, and
    a trace's drafted and accepted tokens under its summary."""
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3723.0), what="first document")
        await pilot.pause()
        assert "spec off" in screen_text(app)
        server.docs.append(make_doc(1, spec=True))
        await wait_for(pilot, lambda: uptime_is(app, 3724.0), what="a speculative document")
        await pilot.pause()
        assert "spec k=4 · accept 62% · 2.48/draft" in screen_text(app)
        server.traces["req-done-e"] = make_trace("req-done-e", spec=True)
        app.open_trace("req-done-e")
        await wait_for(pilot, lambda: app.screen.trace is not None, what="the trace")
        await pilot.pause()
        text = screen_text(app)
        assert "speculative: drafted 120 · accepted 74 (62%)" in text
        assert '{"drafted":120,"accepted":74}' in text  # the event list


async def test_a_trace_the_server_no_longer_has(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: len(table_ids(app)) == 8, what="the request rows")
        app.open_trace("req-run-b")
        await wait_for(pilot, lambda: app.screen.error is not None, what="the error")
        assert "cannot load the trace: HTTP 404" in screen_text(app)


async def test_disconnect_is_shown_and_reconnect_resumes(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.connection.is_connected, what="connected")
        await server.stop()
        await wait_for(pilot, lambda: app.connection.state == "disconnected", what="disconnect")
        await pilot.pause()
        header = screen_text(app).splitlines()[1]
        assert "disconnected since" in header and "(1.00s)" not in header
        assert app.connection.since is not None
        assert "113/512 blocks" in screen_text(app)  # the last figures stay on screen

        server.docs = [make_doc(7)]
        await server.start()
        await wait_for(pilot, lambda: uptime_is(app, 3730.0), what="the restarted server")
        await pilot.pause()
        text = screen_text(app)
        assert "disconnected" not in text and server.url in text
        assert "148/512 blocks" in text


async def test_pause_freezes_the_view_until_resumed(server):
    app = app_for(server)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3723.0), what="first document")
        await pilot.press("p")
        assert " PAUSED " in screen_text(app)
        server.docs.append(make_doc(1))
        await wait_for(pilot, lambda: app.latest.doc["uptime_s"] == 3724.0, what="new data")
        assert uptime_is(app, 3723.0) and "113/512 blocks" in screen_text(app)
        await pilot.press("p")
        await pilot.pause()
        assert uptime_is(app, 3724.0) and "118/512 blocks" in screen_text(app)
        assert "PAUSED" not in screen_text(app)


async def test_help_plan_and_tab(server):
    app = app_for(server)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3723.0), what="first document")
        await pilot.press("c")
        assert isinstance(app.screen, PlanScreen)
        text = screen_text(app)
        assert "max_num_seqs" in text and "16" in text
        assert "Memory plan: n/a" in text
        plan_doc = make_doc(1)
        plan_doc["plan"] = {"kv_bytes_per_token": 36864, "num_kv_blocks": 512, "fits": True}
        server.docs.append(plan_doc)
        await wait_for(pilot, lambda: uptime_is(app, 3724.0), what="the document with a plan")
        await pilot.pause()
        assert "kv_bytes_per_token  36864" in screen_text(app)
        await pilot.press("escape", "question_mark")
        assert isinstance(app.screen, HelpScreen)
        assert "pause / resume updates" in screen_text(app)
        assert "out    json json_schema · obj json_object · rx regex" in screen_text(app)
        assert "call tool_call · tool tools sent" in screen_text(app)
        await pilot.press("x")
        assert app.screen is app.main

        order = []
        for _ in range(6):
            await pilot.press("tab")
            node = app.focused
            while node is not None and node.id not in (
                "kv",
                "queue",
                "throughput",
                "gpu",
                "requests",
            ):
                node = node.parent
            order.append(node.id if node is not None else None)
        assert order[:5] == ["kv", "queue", "throughput", "gpu", "requests"]


async def test_api_key_is_sent_and_a_refusal_is_shown():
    srv = FakeStatsServer([make_doc(0)], api_key="sk-top-12345678")
    await srv.start()
    try:
        refused = app_for(srv)
        async with refused.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: refused.connection.state == "disconnected")
            await pilot.pause()
            assert "HTTP 401: invalid API key" in screen_text(refused)
        allowed = app_for(srv, api_key="sk-top-12345678")
        async with allowed.run_test(size=SIZE) as pilot:
            await wait_for(pilot, lambda: uptime_is(allowed, 3723.0), what="authorized stream")
    finally:
        await srv.stop()
