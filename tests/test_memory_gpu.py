"""The plan against the real GPU (-m gpu; random weights in real shapes): for Llama-3-8B and
Qwen2.5-7B, at the class's utilization and under a 24 GiB cap (an RTX 4090's memory on the
H200), the predicted peak is within 5% of the peak measured after warm-up, and the worst-case
load (every sequence at max_model_len, all at once) runs to completion without running out of
memory or growing past the planned budget.

max_model_len is pinned short (the planner plans everything else) so the four worst-case loads
take about a minute on an H200; the property is the same at any length.
"""

from __future__ import annotations

import gc
import json
import random

import pytest

from appliance.model_presets import load_preset
from engine.memory.memory_cap import CAP_ENV
from engine.sampling_params import SamplingParams

MAX_MODEL_LEN = 1024
OUTPUT_LEN = 8


@pytest.fixture
def cuda_clean():
    import torch

    yield torch
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(1.0)  # undo a cap for the next test


@pytest.mark.gpu
@pytest.mark.parametrize("cap_gib", [None, 24], ids=["util-0.9", "cap-24GiB"])
@pytest.mark.parametrize("preset", ["llama-3-8b", "qwen2.5-7b"])
def test_plan_matches_measured_and_survives_the_worst_case(
    preset, cap_gib, monkeypatch, tmp_path, cuda_clean
):
    torch = cuda_clean
    from engine.llm_engine import LLMEngine

    if cap_gib is None:
        monkeypatch.delenv(CAP_ENV, raising=False)
    else:
        monkeypatch.setenv(CAP_ENV, str(cap_gib))
    (tmp_path / "config.json").write_text(json.dumps(load_preset(preset)))
    engine = LLMEngine(
        str(tmp_path), device="cuda", load_format="random", max_model_len=MAX_MODEL_LEN
    )
    p, report = engine.plan, engine.memory
    print(f"\n{preset} cap={cap_gib}: max_num_seqs={p.max_num_seqs} blocks={p.num_kv_blocks}")
    print("\n".join(report.lines()))
    predicted = report.predicted.total
    assert abs(report.measured_peak - predicted) <= 0.05 * predicted

    # worst case: max_num_seqs sequences, each ending exactly at max_model_len, all at once
    cfg, gen = engine.config, random.Random(0)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(
        max_tokens=OUTPUT_LEN, temperature=0.8, top_p=0.9, top_k=50, ignore_eos=True, seed=1
    )
    prompt_len = cfg.max_model_len - OUTPUT_LEN
    for i in range(cfg.max_num_seqs):
        engine.add_request(f"w{i}", [gen.randrange(vocab) for _ in range(prompt_len)], params)
    torch.cuda.reset_peak_memory_stats()
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    torch.cuda.synchronize()
    assert len(finished) == cfg.max_num_seqs
    assert all(
        o.finish_reason == "length" and len(o.token_ids) == OUTPUT_LEN for o in finished.values()
    )
    free, total = torch.cuda.mem_get_info()
    outside = total - free - torch.cuda.memory_reserved()
    serving_peak = outside + torch.cuda.max_memory_reserved()
    budget = int(p.total_bytes * p.gpu_memory_utilization)  # the planned budget, margin included
    print(f"worst-case serving peak {serving_peak / 2**30:.2f} GiB of {budget / 2**30:.2f} GiB")
    assert serving_peak <= budget
    del engine
