"""Starting a real `appliance serve` subprocess for end-to-end tests."""

from __future__ import annotations

import re
import selectors
import subprocess
import sys
import threading
import time

import pytest


def start_server(*flags: str) -> tuple[subprocess.Popen, str]:
    """`appliance serve --port 0 --device cpu <flags>` on the embedded model; returns the process
    and its base URL once it prints the serving line (fails the test if it never does)."""
    cmd = [sys.executable, "-m", "appliance", "serve", "--port", "0", "--device", "cpu", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + 300
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=1.0):
                match = re.search(r"at (http://\S+)/v1", proc.stdout.readline())
                url = match.group(1) if match else None
    if url is None:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stderr.read()[-3000:]}")
    threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe drained
    return proc, url
