"""End to end: a real `appliance serve` process on the embedded model under a small load, the
dashboard attached over HTTP (through the same factory `appliance top` uses): the request
table lists the requests that were sent, the queue saw them run, and a trace opens."""

from __future__ import annotations

import asyncio
import signal
import subprocess

import aiohttp
import pytest
from textual.widgets import DataTable

from tests.support.serve_process import start_server
from tests.support.tui_screen import screen_text, wait_for
from tui import create_app
from tui.screens.trace import TraceScreen

KEY = "sk-tui-e2e-0123456789"
NUM_REQUESTS = 6


@pytest.fixture(scope="module")
def server_url():
    proc, url = start_server(
        "--max-model-len",
        "512",
        "--num-kv-blocks",
        "64",
        "--max-num-seqs",
        "4",
        "--api-key",
        f"tui:{KEY}",
        "--log-level",
        "warning",
    )
    yield url
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)


async def send_load(url: str) -> list[int]:
    """NUM_REQUESTS completions at once (more than max_num_seqs, so some wait)."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def one(i: int) -> int:
            body = {
                "prompt": f"Count to {i + 3}:",
                "max_tokens": 12 + 2 * i,
                "temperature": 0,
                "ignore_eos": True,
            }
            async with session.post(
                f"{url}/v1/completions", json=body, headers={"X-Request-Id": f"tui-e2e-{i}"}
            ) as resp:
                await resp.read()
                return resp.status

        return await asyncio.gather(*(one(i) for i in range(NUM_REQUESTS)))


async def test_dashboard_shows_the_requests_of_a_load_run(server_url):
    app = create_app(server_url, KEY, retry_s=0.2)
    sent = {f"tui-e2e-{i}" for i in range(NUM_REQUESTS)}
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(pilot, lambda: app.connection.is_connected, what="connection")
        load = asyncio.create_task(send_load(server_url))
        table = app.main.query_one("#requests-table", DataTable)

        def finished_rows() -> set[str]:
            rows = {r.value for r in table.rows}
            states = {rid: table.get_row(rid)[1] for rid in rows & sent}
            return {rid for rid, state in states.items() if state == "finished"}

        await wait_for(pilot, lambda: finished_rows() == sent, timeout=120, what="all finished")
        assert await load == [200] * NUM_REQUESTS
        assert max(app.latest.running) >= 1 and max(app.latest.kv_perc) > 0
        text = screen_text(app)
        assert "SmolLM2-135M-Instruct (135M params) on cpu" in text and "max_num_seqs 4" in text
        for rid in sent:
            assert rid in text

        table.move_cursor(row=[r.value for r in table.rows].index("tui-e2e-5"))
        table.focus()
        await pilot.press("enter")
        assert isinstance(app.screen, TraceScreen)
        await wait_for(pilot, lambda: app.screen.trace is not None, what="the trace")
        await pilot.pause()
        text = screen_text(app)
        assert "finished (length)" in text and "gen 22" in text and "first_token" in text
