"""The dashboard's per-key view and decode bandwidth line: rows from /v1/stats "keys" (order,
filter, a server without the section), the GPU panel's bandwidth (share, idle, n/a), and the
per-key table driven with Pilot: beside the requests from 30 rows, swapped in with `k` below,
filtered with `/` while it has focus."""

from __future__ import annotations

import copy

import pytest
from textual.widgets import DataTable

from tests.support.tui_fakes import T0, make_doc
from tests.support.tui_screen import screen_text, wait_for
from tests.support.tui_sources import FakeStatsServer
from tui import create_app
from tui import format as fmt
from tui.keys import key_rows, select_keys
from tui.model import View
from tui.widgets.gpu import bandwidth_line


def test_key_rows_put_interactive_keys_first_then_the_heaviest():
    rows = key_rows(make_doc(0))
    assert [r.name for r in rows] == ["alice", "anonymous", "batch-etl"]
    batch = rows[2]
    assert batch.cells() == ("batch-etl", "batch", "512", "37", "1", "486k", "61.5k", "5m12s")
    assert [r.name for r in select_keys(rows, "batch")] == ["batch-etl"]  # by class
    assert [r.name for r in select_keys(rows, "AL")] == ["alice"]  # by name, any case
    assert key_rows({"keys": {"x": {}}})[0].cells()[1:] == ("n/a",) * 7
    assert key_rows({}) is None  # the server sends no per-key section


def test_counts_and_bandwidth_format():
    assert [fmt.count(v) for v in (987, 12_345, 486_000, 1_234_567, None)] == [
        "987",
        "12.3k",
        "486k",
        "1.23M",
        "n/a",
    ]
    assert [fmt.bandwidth(v) for v in (3940.0, 950.0, 2.5)] == ["3.94 TB/s", "950 GB/s", "2.5 GB/s"]


def test_bandwidth_line_share_idle_and_na():
    doc = make_doc(0)
    assert bandwidth_line(View(doc)).plain == "bw    3.94 TB/s  82% of nominal"
    idle = copy.deepcopy(doc)
    idle["engine"]["num_running"] = 0
    assert bandwidth_line(View(idle)).plain.endswith("of nominal · idle")
    unknown = copy.deepcopy(doc)
    unknown["engine"]["bandwidth"].update(peak_gbs=None, peak_source=None, share_perc=None)
    assert bandwidth_line(View(unknown)).plain == "bw    3.94 TB/s  n/a of peak"
    none = copy.deepcopy(doc)
    none["engine"]["bandwidth"]["achieved_gbs"] = None  # no decode step in the window
    assert bandwidth_line(View(none)).plain == "bw    n/a"
    del none["engine"]["bandwidth"]  # an engine that does not measure it
    assert bandwidth_line(View(none)).plain == "bw    n/a"


@pytest.fixture
async def server():
    srv = FakeStatsServer([make_doc(0)])
    await srv.start()
    yield srv
    await srv.stop()


def key_ids(app) -> list[str]:
    return [k.value for k in app.main.query_one("#keys-table", DataTable).rows]


async def test_the_key_table_swaps_in_and_filters(server):
    app = create_app(server.url, clock=lambda: T0 + 5000, retry_s=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: len(key_ids(app)) == 3, what="the key rows")
        assert "batch-etl" not in screen_text(app)  # below 30 rows the requests show
        await pilot.press("k")
        await pilot.pause()
        text = screen_text(app)
        assert "batch-etl  batch        512   37   1    486k    61.5k  5m12s" in text
        assert "req-run" not in text
        await pilot.press("slash", *"inter", "enter")
        await wait_for(pilot, lambda: key_ids(app) == ["alice", "anonymous"], what="filter")
        assert "Keys · filter 'inter'" in screen_text(app)
        await pilot.press("k")
        await pilot.pause()
        assert "req-run" in screen_text(app)


async def test_the_key_table_sits_below_the_requests_and_says_when_the_server_has_none():
    doc = make_doc(0)
    del doc["keys"]
    srv = FakeStatsServer([make_doc(0), doc])
    await srv.start()
    try:
        app = create_app(srv.url, clock=lambda: T0 + 5000, retry_s=0.05)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: "no per-key figures" in screen_text(app), what="doc 2")
            text = screen_text(app)
            assert "req-run" in text and "─Keys" in text
    finally:
        await srv.stop()
