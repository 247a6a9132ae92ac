"""Starting `appliance serve` as a subprocess and stopping it: what `appliance soak --serve`, the
serving benchmarks and the end-to-end tests use to run a real server beside them."""

from __future__ import annotations

import re
import selectors
import subprocess
import sys
import threading
import time


def launch_serve(flags: list[str], timeout_s: float = 300, env: dict | None = None):
    """`appliance serve --port 0 <flags>` as a subprocess; returns it and its base URL once it
    prints the serving line, both pipes kept drained. Raises RuntimeError with the end of its
    stderr when it exits or `timeout_s` passes first."""
    cmd = [sys.executable, "-m", "appliance", "serve", "--port", "0", *flags]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            if sel.select(timeout=1.0):
                match = re.search(r"at (http://\S+)/v1", proc.stdout.readline())
                url = match.group(1) if match else None
    if url is None:
        proc.kill()
        raise RuntimeError(f"appliance serve did not start: {proc.stderr.read()[-3000:]}")
    for pipe in (proc.stdout, proc.stderr):  # keep both drained
        threading.Thread(target=pipe.read, daemon=True).start()
    return proc, url


def stop_server(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """SIGTERM a server from launch_serve and wait for it to drain; kill it past `timeout_s`."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
