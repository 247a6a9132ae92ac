"""A bounded soak of a running appliance: a mixed load in --duration / --interval intervals,
each followed by a pause until the server is idle and a reading of its memory and KV blocks.

    python scripts/soak.py --serve "--device cpu --max-model-len 1024" --duration 30m --out DIR
    python scripts/soak.py --url http://127.0.0.1:8000 --api-key K1 --api-key K2 --duration 30m

The load (scripts/soak_load.py): chat and completion requests, streamed or not, short and long
prompts, cycling through the API keys, at --concurrency; mid-stream disconnects among them; in
each interval a burst of malformed bodies (400 expected), an abort storm and a 429 storm past
the server's queue (429 expected, not an error). Each interval records p50/p99 TTFT and TPOT
from the streamed answers, how every request ended, and once idle: RSS of the server and its
child processes (the engine core; psutil, when the server runs on this host), GPU memory and
KV blocks in use (/v1/stats), requests still held (/v1/stats and /metrics).

Fails (exit status 1, the reasons printed) when RSS or GPU memory rises more than 1% from the
first interval after --warmup (and after as many requests as the server keeps records of,
/v1/stats server.records_kept: filling that store is not drift) to the last, p99 TTFT or TPOT
more than 10%, a KV block or a request is held at idle, an answer has a 5xx status, a request
is lost (timed out, connection failed, or a 200 ended short of its end) or a malformed body is
not refused with 400. Writes DIR/soak.json and PNG plots, and prints a markdown table of the
intervals.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import signal
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.loadgen.report import parse_duration  # noqa: E402
from scripts.soak_load import (  # noqa: E402
    DISCONNECT_SHARE,
    Client,
    LoadConfig,
    Recorder,
    run_load,
)
from scripts.soak_report import write_report  # noqa: E402
from scripts.soak_rules import Interval, summary_table, verdict  # noqa: E402
from tests.support.serve_process import launch_serve, stop_server  # noqa: E402

IDLE_POLL_S = 0.2
STORM_MARGIN = 8
"""Requests a 429 storm sends past the server's running slots plus its queue."""


def span(text: str) -> tuple[int, int]:
    """'LO-HI' (or one number) as a pair of positive integers."""
    low, _, high = text.partition("-")
    try:
        pair = (int(low), int(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: use LO-HI, e.g. 16-64") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"bad range {text!r}: need 1 <= LO <= HI")
    return pair


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running appliance's base URL")
    where.add_argument("--serve", help="start `appliance serve ARGS` here and stop it after")
    p.add_argument("--api-key", action="append", default=[], help="repeat for several keys")
    p.add_argument("--model", help="the model name sent in each body (default: the server's)")
    p.add_argument("--duration", type=parse_duration, default=parse_duration("30m"))
    p.add_argument("--interval", type=parse_duration, default=parse_duration("60s"))
    p.add_argument("--warmup", type=parse_duration, default=parse_duration("60s"))
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=span, default=(16, 64), help="LO-HI output tokens")
    p.add_argument("--long-words", type=span, default=(150, 300), help="LO-HI long prompt words")
    p.add_argument(
        "--disconnect-share",
        type=float,
        default=DISCONNECT_SHARE,
        help=f"of the load, the share of streams closed mid-way (default {DISCONNECT_SHARE})",
    )
    p.add_argument("--storm-size", type=int, help="default: running slots + queue + 8")
    p.add_argument("--idle-timeout", type=parse_duration, default=parse_duration("15s"))
    p.add_argument("--request-timeout", type=parse_duration, default=parse_duration("120s"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.concurrency < 1 or args.interval <= 0 or args.duration < args.interval:
        p.error("--concurrency must be >= 1 and --duration at least one --interval")
    if not 0.0 <= args.disconnect_share <= 1.0:
        p.error("--disconnect-share must be between 0 and 1")
    return args


async def get_json(session: aiohttp.ClientSession, url: str, headers: dict) -> dict:
    async with session.get(url, headers=headers) as resp:
        resp.raise_for_status()
        return await resp.json()


async def metrics_inflight(session: aiohttp.ClientSession, url: str, headers: dict) -> int | None:
    async with session.get(f"{url}/metrics", headers=headers) as resp:
        return held_in_metrics(await resp.text()) if resp.status == 200 else None


def held_in_metrics(text: str) -> int | None:
    """Requests held as a /metrics page has them: the larger of the server's in-flight gauge
    and the engine's running plus waiting (None when it has none of them)."""
    values = {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }
    names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
    engine = sum(values[n] for n in names if n in values) if names[0] in values else None
    held = [v for v in (values.get("appliance:requests_in_flight"), engine) if v is not None]
    return int(max(held)) if held else None


def rss_bytes(pid: int | None) -> int | None:
    """Resident memory of a process and all its descendants; None when it cannot be read."""
    if pid is None:
        return None
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in (root, *root.children(recursive=True)))
    except psutil.Error:
        return None


async def read_idle(client: Client, pid: int | None, timeout_s: float) -> dict:
    """Wait until the server holds no request and no KV block (or `timeout_s` passes) and
    return the readings of that moment."""
    url, headers = client.cfg.url, client.headers(client.cfg.api_keys[0])
    deadline = time.perf_counter() + timeout_s
    while True:
        doc = await get_json(client.session, f"{url}/v1/stats", headers)
        queue = doc.get("queue") or {}
        from_metrics = await metrics_inflight(client.session, url, headers)
        inflight = max(
            doc.get("requests_in_flight") or 0,
            (queue.get("num_running") or 0) + (queue.get("num_waiting") or 0),
            from_metrics or 0,
        )
        blocks = (doc.get("kv") or {}).get("blocks_used")
        if (inflight == 0 and blocks == 0) or time.perf_counter() > deadline:
            break
        await asyncio.sleep(IDLE_POLL_S)
    server_rss = (doc.get("server") or {}).get("rss_bytes")
    return {
        "rss_bytes": server_rss if server_rss is not None else rss_bytes(pid),
        "gpu_memory_bytes": (doc.get("gpu") or {}).get("memory_used_bytes"),
        "kv_blocks_idle": blocks,
        "inflight_idle": inflight,
    }


def local_pid(url: str, doc: dict) -> int | None:
    """The server's pid from /v1/stats when it runs on this host (a loopback URL)."""
    host = urlparse(url).hostname or ""
    is_local = host in ("localhost", "::1") or host.startswith("127.")
    return (doc.get("server") or {}).get("pid") if is_local else None


async def soak(args: argparse.Namespace, url: str, pid: int | None) -> int:
    keys = args.api_key or [None]
    rng = random.Random(args.seed)
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        auth = {"Authorization": f"Bearer {keys[0]}"} if keys[0] else {}
        doc = await get_json(session, f"{url}/v1/stats", auth)
        pid = pid or local_pid(url, doc)
        max_num_seqs = (doc.get("config") or {}).get("max_num_seqs") or 0
        max_queue = (doc.get("server") or {}).get("max_queue") or 0
        records_kept = (doc.get("server") or {}).get("records_kept") or 0
        storm = args.storm_size or max_num_seqs + max_queue + STORM_MARGIN
        cfg = LoadConfig(
            url,
            keys,
            args.concurrency,
            storm,
            args.model,
            args.request_timeout,
            long_words=args.long_words,
            max_tokens=args.max_tokens,
            disconnect_share=args.disconnect_share,
        )
        rec = Recorder()
        client = Client(session, cfg, rec)
        print(
            f"soak of {url} ({doc.get('model')}, {doc.get('device')}): "
            f"{round(args.duration / args.interval)} intervals of {args.interval:g} s load, "
            f"concurrency {args.concurrency}, storms of {storm} "
            f"(max_num_seqs {max_num_seqs} + max_queue {max_queue}), keys {len(keys)}, "
            f"RSS {'of pid ' + str(pid) if pid else 'not readable'}",
            flush=True,
        )
        rows: list[dict] = []
        t0 = time.perf_counter()
        # Whole intervals only: a short last one would compare few latencies with many.
        for index in range(max(1, round(args.duration / args.interval))):
            start = time.perf_counter() - t0
            sent = sum(rec.ledger.sent.values())
            rec.interval = Interval(index, start, start, num_sent_before=sent)
            await run_load(client, rng, args.interval)
            readings = await read_idle(client, pid, args.idle_timeout)
            for name, value in readings.items():
                setattr(rec.interval, name, value)
            rec.interval.t_end = time.perf_counter() - t0
            rows.append(rec.interval.stats())
            print(summary_table(rows[-1:]).splitlines()[-1], flush=True)
    reasons = verdict(rows, rec.ledger, args.warmup, records_kept)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    settings |= {"url": url, "storm_size": storm, "pid": pid, "api_key": len(args.api_key)}
    settings |= {"records_kept": records_kept}
    paths = write_report(args.out, settings, rows, rec.ledger, reasons)
    print("\n" + summary_table(rows) + "\n")
    print(f"requests: {rec.ledger.to_json()}")
    print(f"wrote {', '.join(str(p) for p in paths)}")
    if reasons:
        print("FAIL:\n" + "\n".join(f"- {r}" for r in reasons))
        return 1
    print("PASS: no drift, no KV block or request held at idle, no 5xx, no lost request")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.url:
        return asyncio.run(soak(args, args.url.rstrip("/"), None))
    flags = shlex.split(args.serve) + [f for k in args.api_key for f in ("--api-key", k)]
    proc, url = launch_serve(flags)
    # SIGTERM and SIGINT (ignored by default in a background job) stop the server started here.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda num, _: sys.exit(128 + num))
    try:
        return asyncio.run(soak(args, url, proc.pid))
    finally:
        stop_server(proc)


if __name__ == "__main__":
    sys.exit(main())
