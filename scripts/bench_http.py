"""The serving path's own ceiling: `appliance serve`'s HTTP/SSE side with a stand-in engine
whose step costs a fixed time and no compute (tests/support/fake_engine.py), driven by `appliance
bench` from another process. Output tok/s here bounds what any GPU can deliver to clients.

    .venv/bin/python scripts/bench_http.py [--step-ms 5] [--concurrency 64,256] [--out DIR]
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import sys
sys.path.insert(0, {root!r})
from aiohttp import web
from appliance.server import create_app
from appliance.settings import ServeSettings
from tests.support.fake_engine import FakeEngine
engine = FakeEngine(step_time={step}, markers=False, max_num_seqs=512, max_model_len=4096,
                    max_num_batched_tokens=8192, num_kv_blocks=200000, block_size=16)
web.run_app(create_app(ServeSettings(warmup=False, max_queue=4096), engine),
            host="127.0.0.1", port={port}, print=None)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not turn healthy in {seconds:.0f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--step-ms", type=float, default=5.0, help="the stand-in engine's step")
    ap.add_argument("--concurrency", default="64,256")
    ap.add_argument("--output-len", default="256")
    ap.add_argument("--duration", default="15s")
    ap.add_argument("--out", default=str(ROOT / "out" / "bench_http"))
    args = ap.parse_args()
    port = free_port()
    code = SERVER.format(root=str(ROOT), step=args.step_ms / 1e3, port=port)
    server = subprocess.Popen([sys.executable, "-c", code])
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        bench = [
            sys.executable,
            "-m",
            "appliance",
            "bench",
            "--url",
            url,
            "--no-progress",
            "--concurrency",
            args.concurrency,
            "--input-len",
            "16",
            "--output-len",
            args.output_len,
            "--duration",
            args.duration,
            "--out",
            args.out,
        ]
        return subprocess.call(bench, cwd=ROOT)
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
