"""The engine's host cost per step: everything but the device's work, at a given batch.

    .venv/bin/python -m benchmarks.bench_host [--seqs 256] [--steps 60] [--phases]
    .venv/bin/python -m benchmarks.bench_host --prefill 1024   # one request's prefill (workload C)

The model forward and LM head are replaced by stubs that return zeros at once (tiny-shape
Llama, CPU), so a step's time is the Python side alone: scheduling, block bookkeeping, input and
sampling preparation, sampling on a tiny vocabulary, reading tokens back, and building the
outputs. With overlapped steps (the default on a GPU) this runs while the device computes the
previous step, so it must stay well below a decode step (Qwen3-0.6B, 256 sequences: about 7.5
ms of GPU kernels on the H200, benchmarks/profile_workload.py, 2026-11-29).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

import engine.runner.model_runner as model_runner
from benchmarks.presets import materialise_preset, random_prompts
from engine import LLM, SamplingParams


class StubModel(torch.nn.Module):
    """Zeros of the right shapes, at once: the device's share of a step is left out."""

    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.hidden, self.vocab = hidden, vocab

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return torch.zeros(input_ids.shape[0], self.hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden.shape[0], self.vocab)


def timed_phases(engine) -> dict[str, float]:
    """Wrap the step's phases with timers; returns the (growing) seconds per phase."""
    spent: dict[str, float] = {}

    def wrap(owner, name: str, label: str) -> None:
        fn = getattr(owner, name)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - start

        setattr(owner, name, timed)

    for owner, name in [
        (engine.scheduler, "schedule"),
        (engine.scheduler, "resolve"),
        (model_runner, "prepare_inputs"),
        (model_runner, "prepare_sampling"),
        (model_runner, "sample"),
        (engine, "_output"),
    ]:
        wrap(owner, name, name)
    return spent


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--phases", action="store_true", help="time each phase too")
    ap.add_argument("--prefill", type=int, default=0, help="time one N-token request instead")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    folder = materialise_preset("llama-3-8b", "/tmp", tiny=True)
    llm = LLM(
        str(folder),
        device="cpu",
        load_format="random",
        max_model_len=8192,
        max_num_seqs=args.seqs,
        max_num_batched_tokens=8192,
        num_kv_blocks=args.seqs * 100 + 1024,
    )
    engine = llm.engine
    cfg = engine.model_config
    engine.runner.model = StubModel(cfg.hidden_size, cfg.vocab_size)
    if args.prefill:
        prefill_host(llm, args)
        return
    params = SamplingParams(max_tokens=args.steps + 50, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(random_prompts(args.seqs, 100, 1024, cfg.vocab_size, seed=10)):
        engine.add_request(f"r{i}", prompt, params)
    while engine.scheduler.waiting or any(
        r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running
    ):
        engine.step()
    spent = timed_phases(engine) if args.phases else {}
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e3)
    print(
        f"host cost per decode step, {args.seqs} sequences: median "
        f"{statistics.median(times):.2f} ms, min {min(times):.2f} ms"
    )
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name:18s} {seconds / args.steps * 1e3:6.2f} ms")


def prefill_host(llm: LLM, args: argparse.Namespace) -> None:
    """Host time of one request of args.prefill tokens and max_tokens=1, arrival to output
    (workload C's TTFT less the device's work), each prompt fresh."""
    vocab = llm.engine.model_config.vocab_size
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    spent = timed_phases(llm.engine) if args.phases else {}
    times = []
    for i in range(args.steps):
        prompt = random_prompts(1, args.prefill, args.prefill, vocab, seed=100 + i)
        start = time.perf_counter()
        llm.generate(prompt, params)
        times.append((time.perf_counter() - start) * 1e3)
    print(
        f"host cost of one {args.prefill}-token request: median "
        f"{statistics.median(times):.2f} ms, min {min(times):.2f} ms"
    )
    for name, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {name:18s} {seconds / args.steps * 1e3:6.2f} ms")


if __name__ == "__main__":
    main()
