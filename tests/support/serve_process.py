"""Starting a real `appliance serve` for end-to-end tests: in a subprocess (on top of
appliance.serve_process) or as an in-process task whose URL line is awaited."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time

import pytest

from appliance.serve_process import launch_serve, stop_server

__all__ = ["launch_serve", "start_server", "stop_server", "wait_for_url"]


async def wait_for_url(capsys, task, timeout_s: float = 20.0) -> str:
    """The base URL from the serving line an in-process serve() task prints (captured by
    pytest's capsys); fails when the task ends first or no line comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = re.search(r"at (https?://\S+)/v1", capsys.readouterr().out)
        if match:
            return match.group(1)
        assert not task.done(), task.result()
        await asyncio.sleep(0.02)
    raise AssertionError("no URL line")


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """`appliance serve --port 0 --device cpu <flags>` on the embedded model; returns the process
    and its base URL once it prints the serving line (fails the test if it never does)."""
    try:
        return launch_serve(["--device", "cpu", *flags])
    except RuntimeError as exc:
        pytest.fail(str(exc))
