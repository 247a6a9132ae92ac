"""Swap time of the model registry: the embedded model served under two names with room for
one (`--models-max 1`), requests alternating between them, so every request unloads one
engine core and loads the other before its first token.

Prints the median time to first token of a swapping request against its floor, a request to
the model already loaded, and the engine's own start-up seconds (the core's report), so the
registry's share (drain, process end, planning ahead, process start) is what remains.

    python -m benchmarks.bench_registry_swap [--swaps 6] [--device cpu] [--warmup]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from aiohttp.test_utils import TestClient, TestServer

from appliance.server import create_app
from appliance.server.app_keys import REGISTRY, STATE
from appliance.server.state import Phase
from appliance.settings import ServeSettings
from engine.models.embedded import default_model_path

BODY = {"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}


async def first_token_s(client: TestClient, model: str) -> float:
    start = time.perf_counter()
    resp = await client.post("/v1/completions", json={**BODY, "model": model})
    assert resp.status == 200, await resp.text()
    await resp.read()
    return time.perf_counter() - start


async def run(swaps: int, device: str, warmup: bool) -> None:
    path = str(default_model_path())
    settings = ServeSettings(
        model=[f"x={path}", f"y={path}"],
        models_max=1,
        device=device,
        warmup=warmup,
        max_model_len=512,
        log_level="warning",
    )
    app = create_app(settings)
    async with TestClient(TestServer(app)) as client:
        while app[STATE].phase is not Phase.READY:
            await asyncio.sleep(0.05)
        loaded = [await first_token_s(client, "x") for _ in range(3)]
        swapped, startup = [], []
        for i in range(swaps):
            model = "y" if i % 2 == 0 else "x"
            swapped.append(await first_token_s(client, model))
            plan = app[REGISTRY].entries[model].state.engine.plan or {}
            startup.append((plan.get("startup_s") or {}).get("total", 0.0))
    swap, floor, engine = map(statistics.median, (swapped, loaded, startup))
    print(f"device={device} warmup={warmup} swaps={swaps} model=embedded SmolLM2-135M")
    print(f"swap: first token after a swap, median {swap:.2f} s")
    print(f"floor: first token on the loaded model, median {floor * 1000:.1f} ms")
    print(f"engine start-up (the core's own report), median {engine:.2f} s")
    print(f"registry share (swap - engine start-up - floor): {swap - engine - floor:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--swaps", type=int, default=6)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--warmup", action="store_true", help="warm each engine up on load")
    args = parser.parse_args()
    asyncio.run(run(args.swaps, args.device, args.warmup))


if __name__ == "__main__":
    main()
