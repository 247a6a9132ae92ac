"""Where a decode step's time goes: schedule, input preparation, forward (graph replay or
eager), logits + sampling, update. Each phase is synchronised so GPU time lands in its phase.

    python -m benchmarks.profile_step --preset llama-3-8b --batch 1 [--eager]
    python -m benchmarks.profile_step --preset qwen3-30b-a3b --kernels 25

--kernels N also runs the forward under torch.profiler (graph replays, then eagerly) and prints
the N kernels with the most GPU time a step, and the sum of all kernel time against the step's
wall time (the difference is launch gaps and host work).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from benchmarks import ROOT
from engine import LLM, SamplingParams
from engine.runner.forward_context import forward_context
from engine.runner.input_prep import prepare_inputs, prepare_sampling
from engine.runner.sampler import sample

PROFILES = ROOT / "profiles" / "models"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="llama-3-8b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--eager", action="store_true")
    ap.add_argument("--kernels", type=int, default=0, help="print the top N kernels a step")
    ap.add_argument("--trace", type=Path, help="write a Chrome trace of the profiled steps")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp())
    (folder / "config.json").write_text((PROFILES / f"{args.preset}.json").read_text())
    llm = LLM(
        str(folder),
        load_format="random",
        max_model_len=args.context + args.steps + 8,
        max_num_seqs=max(args.batch, 1),
        enforce_eager=args.eager,
        overlap_steps=False,  # phases are timed one after another, each synchronised
    )
    engine, runner = llm.engine, llm.engine.runner
    params = SamplingParams(max_tokens=args.steps + 8, temperature=0.0, ignore_eos=True)
    g = torch.Generator().manual_seed(0)
    for i in range(args.batch):
        engine.add_request(
            str(i), torch.randint(1, 1000, (args.context,), generator=g).tolist(), params
        )
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running) or (
        engine.scheduler.waiting
    ):
        engine.step()
    for _ in range(3):
        engine.step()  # warm
    phases: dict[str, float] = defaultdict(float)

    @contextmanager
    def phase(name: str):
        torch.cuda.synchronize()
        start = time.perf_counter()
        yield
        torch.cuda.synchronize()
        phases[name] += time.perf_counter() - start

    vocab = runner.model_config.vocab_size
    wall = time.perf_counter()
    for _ in range(args.steps):
        with phase("schedule"):
            batch = engine.scheduler.schedule()
        with phase("prepare_inputs"):
            ids, pos, meta, rows, _ = prepare_inputs(batch, runner.block_size, runner.device)
        with phase("forward (graph)" if runner.graphs is not None else "forward (eager)"):
            if runner.graphs is not None:
                hidden = runner.graphs.run(ids, pos, meta)
            else:
                with forward_context(meta):
                    hidden = runner.model(ids, pos)
        with phase("lm_head"):
            logits = runner.model.compute_logits(hidden[rows])
        with phase("prepare_sampling"):
            st = prepare_sampling(batch.requests, vocab, runner.device)
        with phase("sample + sync"):
            tokens = sample(logits, st).token_ids.tolist()
        with phase("update + outputs"):
            sampled = {i: (t, None) for i, t in enumerate(tokens)}
            engine.scheduler.advance(batch)
            for req in engine.scheduler.resolve(batch, sampled):
                engine._output(req)
    wall = time.perf_counter() - wall
    total = sum(phases.values())
    report = {k: round(v / args.steps * 1e3, 3) for k, v in phases.items()}
    print(
        json.dumps(
            {
                "preset": args.preset,
                "batch": args.batch,
                "ms_per_step": report,
                "sum_ms": round(total / args.steps * 1e3, 3),
                "wall_ms": round(wall / args.steps * 1e3, 3),
            },
            indent=1,
        )
    )
    # and the real step loop, unsynchronised, for comparison
    t = time.perf_counter()
    for _ in range(min(args.steps, 3)):
        engine.step()
    torch.cuda.synchronize()
    print(f"engine.step(): {(time.perf_counter() - t) / 3 * 1e3:.2f} ms per step")
    if args.kernels:  # last: it schedules a batch it never resolves
        kernel_report(engine, runner, args.kernels, args.trace)


def kernel_report(engine, runner, top: int, trace: Path | None, steps: int = 10) -> None:
    """The forward of one decode batch under torch.profiler, as graph replays (where the
    runner has graphs) and eagerly: per step, the top kernels by GPU time, the sum of all
    kernel time, and the wall time."""
    from torch.profiler import ProfilerActivity, profile

    batch = engine.scheduler.schedule()
    ids, pos, meta, _, _ = prepare_inputs(batch, runner.block_size, runner.device)
    modes = {"eager": False} | ({"graph": True} if runner.graphs is not None else {})
    for mode, graphed in modes.items():

        def forward(graphed=graphed):
            if graphed:
                return runner.graphs.run(ids, pos, meta)
            with forward_context(meta):
                return runner.model(ids, pos)

        for _ in range(3):
            forward()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(steps):
            forward()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) / steps * 1e6
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                forward()
            torch.cuda.synchronize()
        if trace is not None:
            prof.export_chrome_trace(str(trace.with_suffix(f".{mode}.json")))
        kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        for ev in prof.events():
            if ev.device_type == torch.autograd.DeviceType.CUDA:
                k = kernels[ev.name[:90]]
                k[0] += ev.time_range.elapsed_us() / steps  # us per step
                k[1] += 1 / steps
        total = sum(t for t, _ in kernels.values())
        count = sum(n for _, n in kernels.values())
        print(
            f"\n{mode} forward, batch {len(batch.requests)}: wall {wall_us:.1f} us a step, "
            f"kernels {total:.1f} us ({total / wall_us:.0%} of wall), {count:.0f} launches a step"
        )
        print(f"{'us/step':>9} {'calls':>6} {'us/call':>8}  kernel")
        for name, (t, n) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"{t:9.1f} {n:6.0f} {t / max(n, 1e-9):8.2f}  {name}")


if __name__ == "__main__":
    main()
