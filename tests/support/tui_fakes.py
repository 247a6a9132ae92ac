"""Fakes for the dashboard tests, the main screen's: recorded-style /v1/stats documents with
fixed values (traces: tui_trace_fakes.py; the models table: tui_model_fakes.py; servers and
sources that deliver them: tui_sources.py; screen helpers: tui_screen.py).
tests/test_tui_fakes.py keeps the fakes honest against the server."""

from __future__ import annotations

MODEL = "SmolLM2-135M-Instruct"
MODEL_PARAMS = 134_515_008
T0 = 1_760_000_000.0
CONFIG = {
    "max_model_len": 2048,
    "max_num_seqs": 16,
    "max_num_batched_tokens": 2048,
    "block_size": 16,
    "num_kv_blocks": 512,
    "gpu_memory_utilization": 0.9,
    "dtype": "bfloat16",
    "kv_cache_dtype": "auto",
    "quantization": "none",
    "enforce_eager": False,
    "seed": 0,
    "overlap_steps": True,
    "load_format": "auto",
    "speculative": "off",
    "num_speculative_tokens": None,
    "adaptive_batching": False,
    "min_num_batched_tokens": 512,
    "quant_block_size": 64,
    "quantize_embeddings": False,
    "prefix_caching": True,
    "long_prompt_share": 0.5,
    "long_prompt_tokens": None,
    "queue_aging_s": 30.0,
    "fair_share_window_s": 60.0,
    "task": "auto",
    "max_encoder_tokens": 512,
}
GPU = {
    "name": "NVIDIA H200",
    "utilization_perc": 87.0,
    "memory_used_bytes": 120 * 2**30,
    "memory_total_bytes": 141 * 2**30,
    "power_w": 512.3,
    "temperature_c": 61.0,
    "sm_clock_mhz": 1980.0,
}
# id, state, prompt, cached (of prompt), generated, queue, ttft, tpot, kv blocks, preemptions,
# finish, grammar kind (structured), tools sent
ROWS = [
    ("req-run-a", "running", 900, 768, 120, 0.012, 0.091, None, 64, 1, None, None, False),
    ("req-run-b", "running", 300, 0, 40, 0.004, 0.045, None, 22, 0, None, "json_schema", False),
    ("req-run-c", "running", 120, 112, 300, 0.003, 0.030, None, 27, 0, None, None, False),
    ("req-wait-d", "running", 700, 0, 0, None, None, None, 0, 0, None, None, False),
    ("req-done-e", "finished", 500, 256, 256, 0.020, 0.110, 0.0121, 0, 2, "length", None, False),
    ("req-done-f", "finished", 64, 48, 12, 0.001, 0.021, 0.0098, 0, 0, "stop", "tool_call", True),
    ("req-err-g", "timeout", 1500, 0, 3, 0.900, 1.500, None, 0, 0, None, None, False),
    ("req-done-h", "finished", 220, 208, 90, 0.002, 0.052, 0.0105, 0, 0, "stop", None, True),
]
"""req-done-e's trace (make_trace) starts from a 256-token cached prefix."""
KEYS = {
    "alice": ("interactive", 42, 0, 2, 18_400, 6_100, 0.84),
    "batch-etl": ("batch", 512, 37, 1, 486_000, 61_500, 312.5),
    "anonymous": ("interactive", 6, 0, 0, 1_900, 640, 0.05),
}
"""Per key: priority, requests, 429s, running, prompt tokens, generated tokens, queue seconds
(summed); /v1/stats "keys" grows with each document as make_doc shows."""
BANDWIDTH = {"peak_gbs": 4800.0, "bytes_per_step": 290_000_000}
"""The GPU panel's decode bandwidth: an H200's nominal peak, the embedded model's bytes a step."""
GRAMMAR_COMPILE_S = 0.0012
"""The front end's compile time of every structured fake request."""
SPEC = {"num_speculative_tokens": 4, "drafted": 2400, "accepted": 1488, "drafts": 600}
"""A speculative server's k and its draft totals at step 0 (acceptance 62%, 2.48 accepted a draft);
make_trace(spec=True)'s request drafted 120 tokens and had 74 accepted."""


def request_row(spec: tuple, step: int) -> dict:
    """One /v1/stats request row of ROWS' `spec` at `step`."""
    rid, state, prompt, cached, gen, queue, ttft, tpot, kv, pre, finish, structured, tools = spec
    running = state == "running" and queue is not None
    return {
        "id": rid,
        "endpoint": "chat",
        "state": state,
        "http_status": None if state == "running" else (200 if state == "finished" else 504),
        "received_at": T0,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": gen + (4 * step if running else 0),
        "n": 1,
        "queue_s": queue,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": None if state == "running" else 3.2,
        "num_preemptions": pre,
        "images": 2 if rid == "req-run-a" else 0,
        "encoder_s": 0.041 if rid == "req-run-a" else 0.0,
        "finish_reasons": [finish],
        "error": "ttft_timeout: too slow" if state == "timeout" else None,
        "structured": structured,
        "tools": tools,
        "grammar_compile_s": GRAMMAR_COMPILE_S if structured else None,
        "kv_blocks": kv + (step if running else 0),
    }


def _pct(p50: float, p90: float, p95: float, p99: float) -> dict:
    return {"p50": p50, "p90": p90, "p95": p95, "p99": p99, "mean": p50, "count": 40}


def _keys(step: int) -> dict:
    out = {}
    for name, (priority, reqs, rejected, running, prompt, gen, queue_s) in KEYS.items():
        out[name] = {
            "priority": priority,
            "requests_total": reqs + step,
            "rejected_total": rejected,
            "running": running,
            "prompt_tokens_total": prompt + 100 * step,
            "generation_tokens_total": gen + 10 * step,
            "queue_seconds_total": queue_s,
        }
    return out


def _bandwidth(step: int) -> dict:
    achieved = 3940.0 + step
    return {
        "achieved_gbs": achieved,
        "peak_gbs": BANDWIDTH["peak_gbs"],
        "peak_source": "nominal (NVIDIA H200, profiles/gpus/h200.toml)",
        "share_perc": 100 * achieved / BANDWIDTH["peak_gbs"],
        "decode_steps": 4000,
        "bytes_per_step": BANDWIDTH["bytes_per_step"],
        "step_s": BANDWIDTH["bytes_per_step"] / (achieved * 1e9),
        "mixed_steps": 120,
        "window_s": 5.0,
    }


def _spec_decode(step: int) -> dict:
    """The engine's spec_decode section (engine/spec/step.py's SpecCounters.report)."""
    drafts, drafted = SPEC["drafts"] + 4 * step, SPEC["drafted"] + 16 * step
    accepted = SPEC["accepted"] + 10 * step
    return {
        "num_drafts": drafts,
        "num_draft_tokens": drafted,
        "num_accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted,
        "mean_accepted_length": accepted / drafts,
        "k": SPEC["num_speculative_tokens"],
    }


def make_doc(step: int = 0, gpu: bool = True, spec: bool = False) -> dict:
    """The /v1/stats document at `step` (values move a little with each step); with `spec`, of
    a server that drafts n-grams, k = SPEC's."""
    used = 113 + 5 * step
    latency = {
        "ttft_s": _pct(0.045, 0.1, 0.11, 1.5),
        "tpot_s": _pct(0.0105, 0.012, 0.0121, 0.013),
        "itl_s": _pct(0.01, 0.012, 0.0125, 0.02),
        "e2e_s": _pct(1.2, 2.9, 3.2, 4.0),
        "queue_s": _pct(0.003, 0.02, 0.02, 0.9),
    }
    top = [("req-run-a", 64 + step), ("req-run-c", 27 + step), ("req-run-b", 22 + step)]
    hit_rate = 40.0 + 4 * step
    queries = 6000 + 100 * step
    return {
        "object": "appliance.stats",
        "time": T0 + 3723 + step,
        "status": "ok",
        "model": MODEL,
        "model_params": {"total": MODEL_PARAMS, "active": MODEL_PARAMS},
        "uptime_s": 3723.0 + step,
        "device": "cuda:0",
        "config": {
            **CONFIG,
            **(
                {"speculative": "ngram", "num_speculative_tokens": SPEC["num_speculative_tokens"]}
                if spec
                else {}
            ),
        },
        "plan": None,
        "server": {
            "pid": 4242,
            "api_workers": 1,
            "max_queue": 128,
            "records_kept": 1000,
            "auth": False,
            "timeouts_s": {"request": 600.0, "ttft": 300.0, "stall": 60.0, "drain": 30.0},
            "generation_defaults": {
                "temperature": {"value": 1.0, "source": "server"},
                "top_p": {"value": 1.0, "source": "server"},
                "top_k": {"value": -1, "source": "server"},
                "repetition_penalty": {"value": 1.0, "source": "server"},
                "max_tokens": {"value": None, "source": "server"},
            },
        },
        "engine": {
            "num_running": 3,
            "num_waiting": 1 + step % 3,
            "kv_blocks_used": used,
            "kv_blocks_total": 512,
            "num_preemptions_total": 3,
            "prompt_tokens_total": 10_000 + 100 * step,
            "generation_tokens_total": 4000 + 48 * step,
            "num_steps": 900 + step,
            "compiles_after_warmup": 0,
            "prefix_caching": True,
            "prefix_cache_queries_total": 20_000 + 100 * step,
            "prefix_cache_hits_total": 9000 + 60 * step,
            "kv_blocks_cached": 96 + step,
            "bandwidth": _bandwidth(step),
            "spec_decode": _spec_decode(step) if spec else None,
            "last_step_s": 0.011,
            "num_unfinished": 4,
            "kv_usage_perc": 100 * used / 512,
        },
        "kv": {
            "blocks_used": used,
            "blocks_total": 512,
            "usage_perc": 100 * used / 512,
            "num_preemptions_total": 3,
            "top_requests": [{"id": i, "blocks": b, "share_perc": 100 * b / used} for i, b in top],
            "top_share_perc": 100 * sum(b for _, b in top) / used,
            "blocks_cached": 96 + step,
            "prefix_cache": {
                "enabled": True,
                "hit_rate_perc": hit_rate,
                "queries": queries,
                "hits": round(queries * hit_rate / 100),
                "window_s": 60.0,
            },
        },
        "queue": {
            "num_waiting": 1 + step % 3,
            "num_running": 3,
            "rejected_total": 7,
            "timed_out_total": 1,
        },
        "gpu": dict(GPU) if gpu else dict.fromkeys(GPU),
        "requests_in_flight": 4,
        "models": None,  # one model; with several, each one's status, memory and requests
        "by_model": None,  # with several, each loaded model's engine sections (tui_model_fakes)
        "counters": {
            "requests_total": 60,
            "finished_total": 50,
            "rejected_total": 7,
            "errors_total": 0,
            "cancelled_total": 2,
            "timeouts_total": {"ttft_timeout": 1, "request_timeout": 0, "stall_timeout": 0},
        },
        "throughput": {
            "prompt_tokens_per_s": 1834.5 + step,
            "generation_tokens_per_s": 412.25 + step,
            "window_s": 10.0,
        },
        "latency": latency,
        "requests": [request_row(spec, step) for spec in ROWS],
        "traces": [],
        "keys": _keys(step),
    }
