"""The soak's intervals: load, wait until idle, read memory, KV blocks and requests held;
then the verdict and the report (appliance/soak/cmd.py describes the whole run)."""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import psutil
from prometheus_client.parser import text_string_to_metric_families

from appliance.soak.load import Client, LoadConfig, Recorder, run_load
from appliance.soak.report import write_report
from appliance.soak.rules import Interval, summary_table, verdict

IDLE_POLL_S = 0.2
STORM_MARGIN = 8
"""Requests a 429 storm sends past the server's running slots plus its queue."""


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
