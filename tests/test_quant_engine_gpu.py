"""The quantized engine on a GPU with CUDA graphs, its decode batches forced through the
dequantizing GEMM (engine/kernels/wq_gemm.py), against the same engine run eagerly (no GEMM:
the split-K GEMV, the tl.dot GEMM and dequantize + cuBLAS): greedy tokens' log-probabilities
agree while the two runs' tokens do, for many requests at once. Each engine makes its own
kernel choices (engine/startup/kernel_choices.py); the forced timing picks a kernel wherever one is
a candidate (the GEMM, the fused SiLU forms, the batch-1 GEMVs), even where it is slower."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from engine import LLM, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed"
    ),
]
PARAMS = SamplingParams(max_tokens=8, temperature=0.0, logprobs=3, ignore_eos=True)


def _prompts(count: int = 24):
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(3, 40, (count,), generator=g).tolist()
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_graphs_with_the_gemm_match_eager(tiny_llama, kind, monkeypatch):
    import engine.timing as timing

    real = timing.fastest_config

    def gemm_always(configs, call, items, ref):  # the GEMM even where it is not the fastest
        return real([c for c in configs if c is not None], call, items, ref)

    common = dict(
        device="cuda",
        dtype="bfloat16",
        quantization=kind,
        max_num_seqs=24,
        seed=0,
        max_model_len=128,
    )
    eager = LLM(str(tiny_llama), enforce_eager=True, **common)
    refs = eager.generate(_prompts(), PARAMS)
    assert not eager.engine.runner.kernel_choices.quant.gemm  # eager steps time no GEMM
    monkeypatch.setattr(timing, "fastest_config", gemm_always)
    graphs = LLM(str(tiny_llama), **common)
    assert graphs.engine.runner.graphs is not None
    gemm = graphs.engine.runner.kernel_choices.quant.gemm
    assert any(c is not None for buckets in gemm.values() for c in buckets.values())
    assert not eager.engine.runner.kernel_choices.quant.gemm  # the two engines share nothing
    compared = 0
    for ours, ref in zip(graphs.generate(_prompts(), PARAMS), refs):
        for i, (a, b) in enumerate(zip(ours.token_ids, ref.token_ids)):
            top_a, top_b = dict(ours.logprobs[i].top), dict(ref.logprobs[i].top)
            for token in top_a.keys() & top_b.keys():
                assert abs(top_a[token] - top_b[token]) < 0.1, (i, token)
                compared += 1
            if a != b:
                break
    assert compared >= 24 * 4
