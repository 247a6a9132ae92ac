"""The offline half of scripts/bench_serve.py: the engine driven in-process as a closed loop of
`concurrency` requests (a finished request is replaced before the next step, as a server
does), with its output tok/s, TTFT and TPOT and the wall time of its decode-only steps."""

from __future__ import annotations

import statistics
import time

from engine import SamplingParams
from engine.llm_engine import LLMEngine


def params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def closed_loop(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, concurrency: int, tag: str
) -> dict:
    """Run every prompt with at most `concurrency` in flight. Returns output tokens, wall
    seconds, per-request TTFT and TPOT, and the wall seconds of each step() call that
    scheduled no prompt token (a decode-only step)."""
    todo = list(enumerate(prompts))
    todo.reverse()
    in_flight: set[str] = set()
    finished = []
    decode_steps: list[float] = []
    start = time.perf_counter()
    while todo or in_flight:
        while todo and len(in_flight) < concurrency:
            index, prompt = todo.pop()
            request_id = f"{tag}-{index}"
            engine.add_request(request_id, prompt, params(max_tokens))
            in_flight.add(request_id)
        prompt_tokens = engine.prompt_tokens_total
        t = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - t
        if engine.prompt_tokens_total == prompt_tokens and in_flight:
            decode_steps.append(elapsed)
        for out in outputs:
            if out.finished and out.request_id in in_flight:
                in_flight.discard(out.request_id)
                finished.append(out)
    wall = time.perf_counter() - start
    ttft, tpot = [], []
    for out in finished:
        m = out.metrics
        ttft.append(m.first_token_time - m.arrival_time)
        if len(out.token_ids) > 1:
            tpot.append((m.finished_time - m.first_token_time) / (len(out.token_ids) - 1))
    return {
        "num_requests": len(finished),
        "num_output_tokens": sum(len(o.token_ids) for o in finished),
        "wall_s": wall,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "decode_step_s": decode_steps,
    }


def summary(run: dict) -> dict:
    """The figures of one closed-loop run that the table shows (None where nothing was
    measured: a one-token output has no TPOT, a run without decode-only steps no step time)."""

    def median(values: list[float]) -> float | None:
        return statistics.median(values) if values else None

    return {
        "num_requests": run["num_requests"],
        "num_output_tokens": run["num_output_tokens"],
        "wall_s": run["wall_s"],
        "out_tok_s": run["num_output_tokens"] / run["wall_s"],
        "ttft_p50_s": median(run["ttft_s"]),
        "tpot_p50_s": median(run["tpot_s"]),
        "decode_step_p50_s": median(run["decode_step_s"]),
        "num_decode_steps": len(run["decode_step_s"]),
    }
