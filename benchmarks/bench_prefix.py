"""What the prefix cache buys, on one device: three workloads, each run on an engine
with the cache on and then on one with it off, in the same process.

    PYTHONPATH=. python3 scripts/bench_prefix.py --out DIR            # H200: random Llama-3-8B
    .venv/bin/python scripts/bench_prefix.py --cpu --out DIR          # CPU: the embedded model

Workloads (closed loop: a new request as soon as one finishes, up to the concurrency):
- shared: every request is one long system prompt (the same token ids) plus its own random
  question; TTFT p50 and requests/s. Goal: TTFT p50 at least 5x lower, 1.5x the throughput.
- multi_turn: conversations whose every turn sends the whole history (earlier questions and the
  answers the engine gave) plus a new question; TTFT p50 per turn. Goal: the last turn's TTFT
  within 1.5x of the first's.
- random: random prompts that share nothing; output tok/s. Goal: at most 1% lower with the
  cache on.
Greedy, ignore_eos (every answer has the set length). TTFT is the engine's: arrival to first
token, split into the wait for the first step and the steps to the first token. One engine runs
every workload in rounds with the cache on, off, off, on (turned off between rounds, which also
forgets what was cached), fresh prompts each round, the two rounds of each averaged: a device
or host whose speed drifts weighs on both alike, and both use the same memory plan and kernels.
Prints a markdown table; writes DIR/bench_prefix.json.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import deque
from pathlib import Path

import torch

from appliance import model_presets
from engine import LLM, SamplingParams

SIZES = {
    "gpu": dict(
        shared=dict(system=2000, question=100, output=32, requests=128, concurrency=32),
        multi_turn=dict(question=200, answer=200, turns=8, conversations=16),
        random=dict(prompt=512, output=128, requests=512, concurrency=64),
    ),
    "cpu": dict(
        shared=dict(system=384, question=16, output=8, requests=12, concurrency=4),
        multi_turn=dict(question=48, answer=16, turns=4, conversations=3),
        random=dict(prompt=96, output=16, requests=12, concurrency=6),
    ),
}
GOALS = {"shared_ttft_x": 5.0, "shared_throughput_x": 1.5, "turn_ratio": 1.5, "random_loss": 1.0}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("out/bench_prefix"), help="folder")
    ap.add_argument("--cpu", action="store_true", help="the embedded model on the CPU, small")
    ap.add_argument("--model", default="llama-3-8b", help="GPU: preset name (random weights)")
    return ap.parse_args(argv)


def build(args) -> LLM:
    if args.cpu:
        return LLM(device="cpu", max_model_len=2048, max_num_seqs=16)
    folder = model_presets.preset_folder(args.model)
    return LLM(folder, device="cuda", load_format="random", seed=0)


class Driver:
    """Runs requests on one engine in a closed loop and times them."""

    def __init__(self, llm: LLM) -> None:
        self.engine, self.vocab = llm.engine, llm.engine.model_config.vocab_size
        self._n = 0

    def _submit(self, prompt: list[int], output: int) -> str:
        self._n += 1
        rid = f"b{self._n}"
        params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
        self.engine.add_request(rid, prompt, params)
        return rid

    def closed_loop(self, jobs, concurrency: int, on_done=None) -> dict:
        """jobs: a deque of (prompt, output_len, tag); on_done(tag, output) may append more."""
        inflight, done, start = {}, [], time.perf_counter()
        while jobs or inflight:
            while jobs and len(inflight) < concurrency:
                prompt, output, tag = jobs.popleft()
                inflight[self._submit(prompt, output)] = tag
            for out in self.engine.step():
                if out.finished and out.request_id in inflight:
                    tag = inflight.pop(out.request_id)
                    done.append((tag, out))
                    if on_done is not None:
                        on_done(tag, out, jobs)
        return {"wall_s": time.perf_counter() - start, "done": done}

    def ids(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(self.vocab) for _ in range(n)]


def ttft(out) -> float:
    return out.metrics.first_token_time - out.metrics.arrival_time


def shared(d: Driver, s: dict, round_: int = 0) -> dict:
    rng = random.Random(1 + 100 * round_)
    system = d.ids(rng, s["system"])
    jobs = deque((system + d.ids(rng, s["question"]), s["output"], i) for i in range(s["requests"]))
    r = d.closed_loop(jobs, s["concurrency"])
    outs = [o for _, o in r["done"]]
    return {
        "ttft_p50_s": statistics.median(ttft(o) for o in outs),
        "queued_p50_s": statistics.median(
            o.metrics.first_scheduled_time - o.metrics.arrival_time for o in outs
        ),
        "to_first_token_p50_s": statistics.median(
            o.metrics.first_token_time - o.metrics.first_scheduled_time for o in outs
        ),
        "prefill_chunks_mean": statistics.mean(o.metrics.num_prefill_chunks for o in outs),
        "requests_per_s": len(outs) / r["wall_s"],
        "cached_share": sum(o.num_cached_tokens for o in outs)
        / sum(len(o.prompt_token_ids) for o in outs),
    }


def multi_turn(d: Driver, s: dict, round_: int = 0) -> dict:
    rng = random.Random(2 + 100 * round_)
    history = {c: [] for c in range(s["conversations"])}
    by_turn: dict[int, list] = {t: [] for t in range(s["turns"])}

    def next_turn(tag, out, jobs):
        conv, turn = tag
        by_turn[turn].append(out)
        history[conv] = list(out.prompt_token_ids) + list(out.token_ids)
        if turn + 1 < s["turns"]:
            jobs.append((history[conv] + d.ids(rng, s["question"]), s["answer"], (conv, turn + 1)))

    jobs = deque((d.ids(rng, s["question"]), s["answer"], (c, 0)) for c in history)
    r = d.closed_loop(jobs, s["conversations"], next_turn)
    p50 = [statistics.median(ttft(o) for o in by_turn[t]) for t in range(s["turns"])]
    cached = [
        sum(o.num_cached_tokens for o in by_turn[t])
        / sum(len(o.prompt_token_ids) for o in by_turn[t])
        for t in range(s["turns"])
    ]
    return {"ttft_p50_s_by_turn": p50, "cached_share_by_turn": cached, "wall_s": r["wall_s"]}


def random_prompts(d: Driver, s: dict, round_: int = 0) -> dict:
    rng = random.Random(3 + 100 * round_)
    jobs = deque((d.ids(rng, s["prompt"]), s["output"], i) for i in range(s["requests"]))
    r = d.closed_loop(jobs, s["concurrency"])
    tokens = sum(len(o.token_ids) for _, o in r["done"])
    return {"out_tok_s": tokens / r["wall_s"], "wall_s": r["wall_s"]}


WORKLOADS = {"shared": shared, "multi_turn": multi_turn, "random": random_prompts}


def run_toggled(args, sizes: dict) -> tuple[dict, dict]:
    """One engine; each workload in rounds on, off, off, on, the cache set between rounds."""
    llm = build(args)
    d, bm = Driver(llm), llm.engine.block_manager
    d.closed_loop(deque([(d.ids(random.Random(9), 64), 4, 0)]), 1)  # a first request, unmeasured
    runs = {True: {}, False: {}}
    for name, fn in WORKLOADS.items():
        for round_, caching in enumerate((True, False, False, True)):
            bm.set_caching(caching)
            runs[caching].setdefault(name, []).append(fn(d, sizes[name], round_))
            print(f"{name} round {round_} cache {'on' if caching else 'off'}", flush=True)
    out = {
        caching: {n: _mean(results) for n, results in by.items()} for caching, by in runs.items()
    }
    out[True]["stats"] = llm.engine.stats()
    return out[True], out[False]


def _mean(results: list[dict]) -> dict:
    """Field by field mean of equal-shaped results (lists element-wise)."""
    first = results[0]
    return {
        key: [statistics.mean(r[key][i] for r in results) for i in range(len(value))]
        if isinstance(value, list)
        else statistics.mean(r[key] for r in results)
        for key, value in first.items()
    }


def report(on: dict, off: dict, sizes: dict) -> tuple[str, dict]:
    sh_on, sh_off = on["shared"], off["shared"]
    mt_on, mt_off = on["multi_turn"], off["multi_turn"]
    rd_on, rd_off = on["random"], off["random"]
    ttft_x = sh_off["ttft_p50_s"] / sh_on["ttft_p50_s"]
    tput_x = sh_on["requests_per_s"] / sh_off["requests_per_s"]
    ratio_on = mt_on["ttft_p50_s_by_turn"][-1] / mt_on["ttft_p50_s_by_turn"][0]
    ratio_off = mt_off["ttft_p50_s_by_turn"][-1] / mt_off["ttft_p50_s_by_turn"][0]
    loss = (1 - rd_on["out_tok_s"] / rd_off["out_tok_s"]) * 100
    verdict = {
        "shared_ttft_x": ttft_x >= GOALS["shared_ttft_x"],
        "shared_throughput_x": tput_x >= GOALS["shared_throughput_x"],
        "turn_ratio": ratio_on <= GOALS["turn_ratio"],
        "random_loss": loss <= GOALS["random_loss"],
    }

    def mark(key):
        return "pass" if verdict[key] else "miss"

    s, m, r = sizes["shared"], sizes["multi_turn"], sizes["random"]
    turns = len(mt_on["ttft_p50_s_by_turn"])
    lines = [
        "| workload | cache off | cache on | change | goal |",
        "|---|---|---|---|---|",
        f"| shared {s['system']}-token system prompt + {s['question']}-token questions, "
        f"{s['concurrency']} concurrent: TTFT p50 | {sh_off['ttft_p50_s'] * 1e3:.1f} ms | "
        f"{sh_on['ttft_p50_s'] * 1e3:.1f} ms | {ttft_x:.1f}x lower | >= 5x: "
        f"{mark('shared_ttft_x')} |",
        f"| the same: wait for the first step, p50 | {sh_off['queued_p50_s'] * 1e3:.1f} ms | "
        f"{sh_on['queued_p50_s'] * 1e3:.1f} ms | | |",
        f"| the same: first step to first token, p50 (prefill chunks, mean) | "
        f"{sh_off['to_first_token_p50_s'] * 1e3:.1f} ms ({sh_off['prefill_chunks_mean']:.1f}) | "
        f"{sh_on['to_first_token_p50_s'] * 1e3:.1f} ms ({sh_on['prefill_chunks_mean']:.1f}) | | |",
        f"| the same: requests/s | {sh_off['requests_per_s']:.2f} | {sh_on['requests_per_s']:.2f} "
        f"| {tput_x:.2f}x | >= 1.5x: {mark('shared_throughput_x')} |",
        f"| {turns}-turn conversations ({m['question']}-token questions, {m['answer']}-token "
        f"answers, {m['conversations']} at once): TTFT p50 turn {turns} / turn 1 | "
        f"{ratio_off:.2f} | {ratio_on:.2f} | | <= 1.5: {mark('turn_ratio')} |",
        f"| random {r['prompt']}-token prompts, {r['concurrency']} concurrent: out tok/s | "
        f"{rd_off['out_tok_s']:,.1f} | {rd_on['out_tok_s']:,.1f} | {-loss:+.1f}% | >= -1%: "
        f"{mark('random_loss')} |",
        "",
        "| turn | " + " | ".join(str(t + 1) for t in range(turns)) + " |",
        "|---|" + "---|" * turns,
        "| TTFT p50, cache off (ms) | "
        + " | ".join(f"{x * 1e3:.1f}" for x in mt_off["ttft_p50_s_by_turn"])
        + " |",
        "| TTFT p50, cache on (ms) | "
        + " | ".join(f"{x * 1e3:.1f}" for x in mt_on["ttft_p50_s_by_turn"])
        + " |",
        "| prompt tokens cached | "
        + " | ".join(f"{x:.0%}" for x in mt_on["cached_share_by_turn"])
        + " |",
    ]
    figures = {
        "ttft_x": ttft_x,
        "throughput_x": tput_x,
        "turn_ratio_on": ratio_on,
        "turn_ratio_off": ratio_off,
        "random_loss_pct": loss,
        "goals_met": verdict,
    }
    return "\n".join(lines), figures


def main(argv=None) -> int:
    args = parse_args(argv)
    sizes = SIZES["cpu" if args.cpu else "gpu"]
    started = time.time()
    on, off = run_toggled(args, sizes)
    table, figures = report(on, off, sizes)
    device = torch.cuda.get_device_name() if not args.cpu else "CPU"
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "started": started,
        "argv": sys.argv[1:],
        "device": device,
        "sizes": sizes,
        "cache_on": on,
        "cache_off": off,
        "figures": figures,
    }
    (args.out / "bench_prefix.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"\n{args.model if not args.cpu else 'SmolLM2-135M-Instruct'} on {device}\n\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
