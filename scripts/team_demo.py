"""Two keys share one server: a batch key floods long prompts while an interactive key chats.

    PYTHONPATH=. .venv/bin/python scripts/team_demo.py --out DIR [--serve "--device cpu ..."]

Starts `appliance serve` with a key file of two keys (`alice`, interactive; `nightly`, batch
with max_concurrent=6), then prints a transcript:
1. alice alone: a few streamed chats and their time to first token;
2. nightly's flood (--flood long prompts at 8 at once: past its max_concurrent, so some get a
   429 whose headers are shown) while alice chats again;
3. the dashboard attached to the server during the flood, 160x48, as text (the per-key table
   sits under the requests);
4. /v1/stats' keys section after the flood.
Writes DIR/transcript.txt (everything printed) and DIR/dashboard.svg.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from appliance.loadgen.workload import WORDS  # noqa: E402
from tests.support.serve_process import launch_serve, stop_server  # noqa: E402
from tests.support.tui_screen import screen_text, wait_for  # noqa: E402
from tui.app import create_app  # noqa: E402
from tui.sse import DONE, SSEParser  # noqa: E402

KEYS = {
    "alice": ("sk-alice-demo-4f9c1e7d", "priority=interactive"),
    "nightly": ("sk-nightly-demo-a81b20c3", "priority=batch max_concurrent=6"),
}
QUESTIONS = (
    "What is a KV cache?",
    "Name three prime numbers.",
    "Write a haiku about a GPU.",
    "What is the capital of France?",
    "Give me a synonym for fast.",
    "How many legs does a spider have?",
    "Say hello in Spanish.",
    "What colour is the sky on a clear day?",
)


class Transcript:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def say(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name][0]}"}


async def chat(session: aiohttp.ClientSession, url: str, question: str) -> tuple[float, str]:
    """alice's streamed chat: (seconds to the first token, the answer)."""
    body = {
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
        "temperature": 0.0,
        "stream": True,
    }
    start = time.perf_counter()
    first, parts, parser = None, [], SSEParser()
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=auth("alice")) as r:
        r.raise_for_status()
        async for chunk in r.content.iter_any():
            for data in parser.feed(chunk):
                if data == DONE:
                    break
                delta = json.loads(data)["choices"][0]["delta"].get("content")
                if delta:
                    first = first or time.perf_counter() - start
                    parts.append(delta)
    return first or float("nan"), "".join(parts)


async def alice_turns(session, url: str, out: Transcript, label: str) -> list[float]:
    ttfts = []
    for question in QUESTIONS:
        ttft, answer = await chat(session, url, question)
        ttfts.append(ttft)
        out.say(f"  alice [{label}] TTFT {ttft * 1000:6.0f} ms  > {question}")
        out.say(f"      {' '.join(answer.split())[:110]}")
    return ttfts


async def nightly_flood(session, url: str, num: int, out: Transcript) -> dict[str, int]:
    """`num` long prompts from the batch key, 8 at once; a 429 is retried after its
    Retry-After (the first one's headers are printed)."""
    counts = {"completed": 0, "429": 0}
    queue = list(range(num))
    shown = False

    async def one(i: int) -> None:
        nonlocal shown
        prompt = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(300))
        body = {"prompt": prompt, "max_tokens": 48, "ignore_eos": True}
        while True:
            async with session.post(
                f"{url}/v1/completions", json=body, headers=auth("nightly")
            ) as r:
                if r.status == 429:
                    counts["429"] += 1
                    if not shown:
                        shown = True
                        head = ", ".join(
                            f"{h}: {v}"
                            for h, v in r.headers.items()
                            if h.lower() == "retry-after" or h.lower().startswith("x-ratelimit")
                        )
                        error = (await r.json())["error"]
                        out.say(f"  nightly got 429 ({error['code']}): {head}")
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")))
                    continue
                r.raise_for_status()
                await r.read()
                counts["completed"] += 1
                return

    async def worker() -> None:
        while queue:
            await one(queue.pop())

    await asyncio.gather(*(worker() for _ in range(8)))
    return counts


async def dashboard(url: str, out: Transcript, dest: Path) -> None:
    """The dashboard at 160x48 attached to the server, once the per-key table shows both."""
    app = create_app(url, KEYS["alice"][0])
    async with app.run_test(size=(160, 48)) as pilot:
        await wait_for(
            pilot,
            lambda: "nightly" in screen_text(app) and "alice" in screen_text(app),
            timeout=30,
            what="both keys in the dashboard",
        )
        await pilot.pause(1.5)  # a few stats frames: rates and sparklines fill in
        text = screen_text(app)
        dest.write_text(app.export_screenshot())
    out.say("```")
    for line in text.rstrip().splitlines():
        out.say(line.rstrip())
    out.say("```")


async def run(url: str, args: argparse.Namespace, out: Transcript) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        out.say("## 1. alice alone")
        alone = await alice_turns(session, url, out, "alone")
        out.say(f"\n## 2. nightly floods {args.flood} long prompts; alice chats meanwhile")
        flood = asyncio.create_task(nightly_flood(session, url, args.flood, out))
        await asyncio.sleep(3)  # the batch key's requests fill the batch first
        busy = await alice_turns(session, url, out, "during the flood")
        out.say("\n## 3. the dashboard during the flood (160x48)")
        await dashboard(url, out, args.out / "dashboard.svg")
        counts = await flood
        out.say(f"\n  nightly: {counts['completed']} completed, {counts['429']} answered 429")
        async with session.get(f"{url}/v1/stats", headers=auth("alice")) as r:
            keys = (await r.json())["keys"]
        out.say("\n## 4. /v1/stats keys after the flood")
        out.say("| key | class | requests | 429 | prompt tok | gen tok | queued s |")
        out.say("|---|---|---:|---:|---:|---:|---:|")
        for name, k in sorted(keys.items()):
            out.say(
                f"| {name} | {k['priority']} | {k['requests_total']} | {k['rejected_total']} | "
                f"{k['prompt_tokens_total']} | {k['generation_tokens_total']} | "
                f"{k['queue_seconds_total']:.2f} |"
            )
        p50 = statistics.median
        out.say(
            f"\nalice's TTFT p50: {p50(alone) * 1000:.0f} ms alone, "
            f"{p50(busy) * 1000:.0f} ms during the flood ({p50(busy) / p50(alone):.2f}x)"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--serve", default="--device cpu --max-model-len 1024")
    ap.add_argument("--flood", type=int, default=24, help="the batch key's long prompts")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = Transcript()
    with tempfile.TemporaryDirectory() as tmp:
        key_file = Path(tmp) / "keys"
        key_file.write_text("".join(f"{n} {k} {lim}\n" for n, (k, lim) in KEYS.items()))
        flags = [*shlex.split(args.serve), "--api-key-file", str(key_file)]
        out.say(f"$ appliance serve {' '.join(flags)}  # key file:")
        for name, (_, limits) in KEYS.items():
            out.say(f"#   {name} sk-... {limits}")
        proc, url = launch_serve(flags)
        try:
            asyncio.run(run(url, args, out))
        finally:
            stop_server(proc)
    (args.out / "transcript.txt").write_text("\n".join(out.lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
