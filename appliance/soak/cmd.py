"""The `appliance soak` subcommand: its argument parser, and the run that starts a server
(--serve) or attaches to one (--url) and soaks it.

A mixed load in --duration / --interval intervals, each followed by a pause until the server is
idle and a reading of its memory and KV blocks:

    appliance soak --serve "--device cpu --max-model-len 1024" --duration 30m --out DIR
    appliance soak --url http://127.0.0.1:8000 --api-key K1 --api-key K2 --duration 30m

The load (appliance/soak/load.py): chat and completion requests, streamed or not, short and long
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
import shlex
import signal
import sys
import time
from pathlib import Path

from appliance.bench_cmd import default_results_root
from appliance.loadgen.report import parse_duration
from appliance.soak.load import DISCONNECT_SHARE


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


def add_soak_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "soak",
        help="a long mixed load: memory and latency drift, leaks at idle, lost requests",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
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
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for soak.json and the plots (default: a new folder under "
        "$APPLIANCE_RESULTS_DIR, else the user's data folder)",
    )
    return p


def check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags, or None."""
    if args.concurrency < 1 or args.interval <= 0 or args.duration < args.interval:
        return "--concurrency must be >= 1 and --duration at least one --interval"
    if not 0.0 <= args.disconnect_share <= 1.0:
        return "--disconnect-share must be between 0 and 1"
    return None


def run_soak(args: argparse.Namespace) -> int:
    from appliance.serve_process import launch_serve, stop_server
    from appliance.soak.intervals import soak

    problem = check_args(args)
    if problem:
        print(f"appliance soak: {problem}", file=sys.stderr)
        return 2
    if args.out is None:
        args.out = default_results_root() / time.strftime("soak-%Y%m%d-%H%M%S")
    print(f"results go to {args.out}", flush=True)
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
