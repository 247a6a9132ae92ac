"""The dashboard with several models, driven with Textual's Pilot: the models table (status,
memory, requests, last used), the panels showing the model used last, `m`/`M` and a click on a
row switching them to another model's figures (each with its own history), an unloaded model's
panels saying n/a, and a one-model server without the table or the key."""

from __future__ import annotations

from textual.widgets import DataTable

from tests.support.tui_fakes import T0, make_doc
from tests.support.tui_model_fakes import BROKEN, LLAMA, QWEN, SMOL, make_models_doc, never_used
from tests.support.tui_screen import screen_text, wait_for
from tests.support.tui_sources import ReplaySource
from tui import DashboardApp, models

SIZE = (120, 44)


def dashboard(docs: list[dict]) -> DashboardApp:
    return DashboardApp(ReplaySource(docs), clock=lambda: T0)


def shown(app: DashboardApp) -> str | None:
    return app.view.doc.get("model") if app.view is not None else None


def uptime_is(app: DashboardApp, seconds: float) -> bool:
    return app.view is not None and app.view.doc["uptime_s"] == seconds


def table_ids(app: DashboardApp, table: str) -> list[str]:
    return [key.value for key in app.main.query_one(table, DataTable).rows]


# --- the pure part ------------------------------------------------------------------------
def test_rows_and_the_default_model():
    doc = make_models_doc()
    rows = models.model_rows(doc)
    assert [(r.name, r.status) for r in rows] == [
        (SMOL, "loaded"),
        (QWEN, "loaded"),
        (LLAMA, "unloaded"),
        (BROKEN, "failed"),
    ]
    now = doc["time"]
    assert rows[1].cells(now, selected=False) == (
        "  qwen-0.5b",
        "loaded",
        "1.5 GiB",
        "1",
        "8",
        "40.0s ago",
    )
    assert rows[0].cells(now, selected=True)[0] == "> smol*"  # shown, pinned
    assert rows[2].cells(now, selected=False)[2:] == ("16.0 GiB", "0", "0", "never")
    assert rows[3].cells(now, selected=False)[2] == "n/a"
    assert models.default_model(doc) == SMOL  # asked for last
    assert models.default_model(never_used(doc)) == SMOL  # the first loaded
    assert models.model_rows(make_doc()) is None  # one model: no table


def test_focus_swaps_the_engine_sections():
    doc = make_models_doc()
    qwen = models.focus(doc, QWEN)
    assert qwen["engine"]["kv_blocks_total"] == 1024 and qwen["config"]["max_num_seqs"] == 8
    assert qwen["gpu"] == doc["gpu"] and qwen["keys"] == doc["keys"]  # the server's own
    llama = models.focus(doc, LLAMA)
    assert llama["model"] == LLAMA and llama["engine"] is None and llama["requests"] == []
    assert models.step([SMOL, QWEN, LLAMA], LLAMA, 1) == SMOL
    assert models.step([SMOL, QWEN], "gone", 1) == SMOL


# --- the dashboard ------------------------------------------------------------------------
async def test_the_table_lists_each_model_and_m_switches_the_panels():
    app = dashboard([make_models_doc(0), make_models_doc(1)])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3724.0), what="second document")
        await pilot.pause()
        text = screen_text(app)
        assert "Models · showing smol" in text
        assert "> smol*" in text and "qwen-0.5b" in text and "40.0s ago" in text
        assert "llama-8b" in text and "unloaded" in text and "failed" in text
        assert "118/512 blocks" in text and "NOT LOADED" not in text  # smol's KV
        assert table_ids(app, "#requests-table")[0] == "req-run-a"

        await pilot.press("m")
        await wait_for(pilot, lambda: shown(app) == QWEN, what="qwen shown")
        await pilot.pause()
        text = screen_text(app)
        assert "Models · showing qwen-0.5b" in text and "> qwen-0.5b" in text
        assert "710/1024 blocks" in text and "max_num_seqs 8" in text
        assert table_ids(app, "#requests-table") == ["qwen-run-1", "qwen-done-2"]
        assert app.view.kv_perc == (100 * 700 / 1024, 100 * 710 / 1024)  # its own history

        await pilot.press("m")  # the unloaded model: n/a, no requests, no crash
        await wait_for(pilot, lambda: shown(app) == LLAMA, what="llama shown")
        await pilot.pause()
        text = screen_text(app)
        assert "llama-8b  NOT LOADED (unloaded)" in text
        assert "n/a/n/a blocks" in text and "waiting  n/a" in text
        assert "rejected (429) 0 · timed out 0" in text  # its own, not the server's 7
        assert "tok/s prompt n/a" in text and "TTFT      n/a" in text
        assert table_ids(app, "#requests-table") == []
        await pilot.press("c")  # its plan screen too
        await pilot.pause()
        assert "n/a" in screen_text(app)
        await pilot.press("escape")

        await pilot.press("M", "M")
        await wait_for(pilot, lambda: shown(app) == SMOL, what="back to smol")
        app.ingest(make_models_doc(2))  # a new document keeps the choice
        await pilot.pause()
        assert shown(app) == SMOL and "123/512 blocks" in screen_text(app)


async def test_a_click_on_a_row_shows_that_model():
    app = dashboard([make_models_doc(0)])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: table_ids(app, "#models-table") != [], what="the table")
        await pilot.pause()
        table = app.main.query_one("#models-table", DataTable)
        assert table.cursor_row == 0
        await pilot.click("#models-table", offset=(3, 2))  # the header, then smol, qwen's row
        await wait_for(pilot, lambda: shown(app) == QWEN, what="qwen shown by a click")
        await pilot.click("#models-table", offset=(3, 4))  # broken: failed, no figures
        await wait_for(pilot, lambda: shown(app) == BROKEN, what="broken shown by a click")
        await pilot.pause()
        text = screen_text(app)
        assert "n/a/n/a blocks" in text
        assert "NOT LOADED (failed: unknown model_type 'no-such-family')" in text


async def test_a_one_model_server_has_no_models_table_or_key():
    app = dashboard([make_doc(0)])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: app.view is not None, what="first document")
        await pilot.pause()
        assert not app.main.query_one("#models").display
        assert "Models" not in screen_text(app) and " m Model" not in screen_text(app)
        await pilot.press("m")
        await pilot.pause()
        assert shown(app) == "SmolLM2-135M-Instruct"
        app.ingest(make_models_doc(0))  # the same dashboard, now on a server of several
        await pilot.pause()
        assert app.main.query_one("#models").display and "m Model" in screen_text(app)


async def test_switching_while_paused_shows_the_paused_document():
    app = dashboard([make_models_doc(0)])
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: uptime_is(app, 3723.0), what="first document")
        await pilot.press("p")
        app.ingest(make_models_doc(1))
        await pilot.press("m")
        await wait_for(pilot, lambda: shown(app) == QWEN, what="qwen shown")
        await pilot.pause()
        text = screen_text(app)
        assert "PAUSED" in text and "700/1024 blocks" in text  # as of the paused document
        await pilot.press("p")
        await pilot.pause()
        assert "710/1024 blocks" in screen_text(app) and shown(app) == QWEN
