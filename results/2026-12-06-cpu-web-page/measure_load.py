"""What a first load of the web page costs the server, and the page's screenshots.

Starts `appliance serve --device cpu --max-model-len 512` on the embedded model, then:
- a cold load in headless Chromium (a fresh context: empty cache and storage): the requests it
  makes and the bytes of their response bodies and headers (Playwright's request sizes);
- each static file GET `--repeat` times in a row with aiohttp over one kept-alive connection:
  the round trip on loopback, an upper bound on the server's time per request;
- with `--screenshots DIR`: chat-empty.png, chat-answer.png and dashboard.png at 1280x800.

    python results/2026-12-06-cpu-web-page/measure_load.py [--repeat 200] [--screenshots DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp
from playwright.sync_api import sync_playwright

from appliance.serve_process import launch_serve, stop_server
from tests.support.browser import CHROMIUM_ARGS, chromium_path

VIEWPORT = {"width": 1280, "height": 800}


def cold_load(url: str) -> list[tuple[str, str, int, int]]:
    """(path, resource type, body bytes, header bytes) of each request of a first load."""
    rows = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()

        def finished(request) -> None:
            sizes = request.sizes()
            headers = sizes["responseHeadersSize"] + sizes["requestHeadersSize"]
            path = request.url[len(url) :]
            rows.append((path, request.resource_type, sizes["responseBodySize"], headers))

        page.on("requestfinished", finished)
        page.goto(url + "/")
        page.wait_for_selector("body[data-ready]")
        page.wait_for_load_state("networkidle")
        browser.close()
    return rows


async def static_times(url: str, paths: list[str], repeat: int) -> dict[str, list[float]]:
    """Seconds per GET of each path, `repeat` times in a row on one connection."""
    times: dict[str, list[float]] = {}
    async with aiohttp.ClientSession() as session:
        for path in paths:
            for _ in range(3):  # warm the connection and the page cache
                async with session.get(url + path) as resp:
                    await resp.read()
            samples = []
            for _ in range(repeat):
                start = time.perf_counter()
                async with session.get(url + path) as resp:
                    await resp.read()
                    assert resp.status == 200, (path, resp.status)
                samples.append(time.perf_counter() - start)
            times[path] = samples
    return times


def screenshots(url: str, folder: str) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.set_default_timeout(120_000)
        page.goto(url + "/")
        page.wait_for_function("() => document.querySelector('#model').options.length > 0")
        page.screenshot(path=f"{folder}/chat-empty.png")
        page.locator(".settings").evaluate("d => { d.open = true; }")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "60")
        page.dispatch_event("#max-tokens", "change")
        page.fill("#prompt", "What is the capital of France? Answer in two sentences.")
        page.click("#send")
        page.wait_for_function("() => !document.body.classList.contains('generating')")
        page.locator(".settings").evaluate("d => { d.open = false; }")
        page.screenshot(path=f"{folder}/chat-answer.png")
        page.locator(".settings").evaluate("d => { d.open = true; }")
        page.fill("#max-tokens", "200")
        page.dispatch_event("#max-tokens", "change")
        page.fill("#prompt", "Write a long story about a dragon who learns to cook.")
        page.click("#send")
        page.click("#show-dashboard")
        page.locator("#requests-table tbody tr.state-running").first.wait_for()
        page.wait_for_timeout(3000)  # a few seconds of sparkline
        page.screenshot(path=f"{folder}/dashboard.png")
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--screenshots", metavar="DIR")
    args = parser.parse_args()
    proc, url = launch_serve(
        ["--device", "cpu", "--max-model-len", "512", "--log-level", "warning"]
    )
    try:
        rows = cold_load(url)
        print(f"cold load: {len(rows)} requests")
        for path, kind, body, headers in rows:
            print(f"  {path:48} {kind:11} {body:>8} B body {headers:>5} B headers")
        static = [r for r in rows if r[0] == "/" or r[0].startswith("/web/")]
        print(
            f"static: {len(static)} requests, {sum(r[2] for r in static):,} B of bodies, "
            f"{sum(r[3] for r in static):,} B of headers; API: {len(rows) - len(static)} "
            f"requests ({', '.join(r[0] for r in rows if r not in static)})"
        )
        paths = ["/", "/web/app.css", "/web/js/chat.js", "/web/vendor/highlight/highlight.min.js"]
        times = asyncio.run(static_times(url, paths, args.repeat))
        for path, samples in times.items():
            ms = sorted(1000 * s for s in samples)
            print(
                f"GET {path:44} median {statistics.median(ms):.2f} ms, "
                f"p90 {ms[int(0.9 * len(ms))]:.2f} ms ({len(ms)} in a row)"
            )
        if args.screenshots:
            screenshots(url, args.screenshots)
    finally:
        stop_server(proc)


if __name__ == "__main__":
    main()
