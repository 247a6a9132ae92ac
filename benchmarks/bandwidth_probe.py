"""The decode bandwidth figure of engine stats() (what /v1/stats and the dashboard show) at batch
1 and at 64 on the random Llama-3-8B shape:

    python3 -m benchmarks.bandwidth_probe
"""

import json
import time

from appliance import model_presets
from engine import LLM, SamplingParams


def timed(llm: LLM, prompts: list[list[int]], max_tokens: int) -> float:
    """Output tokens per second of one generate call."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start = time.time()
    llm.generate(prompts, params)
    return len(prompts) * max_tokens / (time.time() - start)


def main() -> None:
    folder = model_presets.preset_folder("llama-3-8b")
    llm = LLM(folder, device="cuda", load_format="random", seed=0)
    timed(llm, [[1] * 128], 8)  # first request, unmeasured
    for name, prompts, max_tokens in (
        ("batch 1", [[5] * 128], 512),
        ("batch 64", [[i % 1000 + 1] * 128 for i in range(64)], 256),
    ):
        rate = timed(llm, prompts, max_tokens)
        print(f"{name}: {rate:.1f} tok/s", json.dumps(llm.engine.stats()["bandwidth"]))


if __name__ == "__main__":
    main()
