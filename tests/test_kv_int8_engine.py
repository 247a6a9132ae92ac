"""The engine with kv_cache_dtype="int8": output close to a 32-bit KV cache, preemption and
chunked prefill, the KV-bytes formula, and the trained embedded model.
"""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models.embedded import default_model_path
from engine.models.model_config import ModelConfig
from engine.planner import GIB, Device, PlanRequest, plan
from engine.planner.formulas import kv_bytes_per_token

NEW_TOKENS = 24
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def _prompts(n: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(4)
    lens = [3, 9, 16, 17, 40, 64, 100, 150][:n]
    return [torch.randint(0, 256, (k,), generator=g).tolist() for k in lens]


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    """Mean share of each greedy output that equals the other's up to its first divergence."""
    shares = []
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), len(x))
        shares.append(same / len(x))
    return sum(shares) / len(shares)


@pytest.fixture(scope="module")
def fp32_outputs(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_model_len=256)
    return [o.token_ids for o in llm.generate(_prompts(), GREEDY)]


def test_int8_kv_greedy_mostly_agrees_with_fp32(tiny_llama, fp32_outputs):
    llm = LLM(str(tiny_llama), device="cpu", max_model_len=256, kv_cache_dtype="int8")
    assert llm.engine.runner.kv_pool.dtype == torch.int8
    assert llm.engine.config.kv_cache_dtype == "int8"
    outs = [o.token_ids for o in llm.generate(_prompts(), GREEDY)]
    # Random weights make a near-tie at some step likely; most tokens still agree, and the
    # first token (the prompt's own prefill, read back from the int8 cache) nearly always.
    assert _agreement(outs, fp32_outputs) >= 0.75  # measured 0.90 (one early divergence)
    assert sum(o[0] == r[0] for o, r in zip(outs, fp32_outputs)) >= 7


def test_int8_kv_under_preemption_and_chunked_prefill(tiny_llama):
    plain = LLM(str(tiny_llama), device="cpu", max_model_len=256, kv_cache_dtype="int8")
    expect = [o.token_ids for o in plain.generate(_prompts(), GREEDY)]
    llm = LLM(
        str(tiny_llama),
        device="cpu",
        kv_cache_dtype="int8",
        num_kv_blocks=12,
        max_num_seqs=8,  # more than the pool holds at once: preemption
        max_num_batched_tokens=24,
        max_model_len=180,
    )
    outs = llm.generate(_prompts(), GREEDY)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    # Recomputation after preemption re-quantizes the same K/V rows: identical caches, and
    # chunking changes no stored value (per-token scales), so the outputs are the same.
    assert [o.token_ids for o in outs] == expect
    assert llm.engine.block_manager.num_free_blocks == 12


def test_kv_bytes_one_formula_for_engine_and_planner():
    m = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 128256,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
        }
    )
    bf16 = 2 * 32 * 8 * 128 * 2  # Llama-3-8B: 128 KiB per token
    int8 = 2 * 32 * 8 * (128 + 2)  # 1 byte per element + an fp16 scale per token and KV head
    assert kv_bytes_per_token(m, "bfloat16") == m.kv_cache_bytes_per_token("bfloat16") == bf16
    assert kv_bytes_per_token(m, "int8") == m.kv_cache_bytes_per_token("int8") == int8
    # a CPU whose KV pool is capped at 1 GiB: the planned pool holds 1 GiB of either dtype
    cpu = Device(kind="cpu", name="cpu", total_bytes=64 * GIB, max_kv_bytes=GIB)
    pins = dict(max_model_len=2048, dtype="float32")
    blocks16 = plan(m, cpu, PlanRequest(kv_cache_dtype="bfloat16", **pins)).num_kv_blocks
    blocks8 = plan(m, cpu, PlanRequest(kv_cache_dtype="int8", **pins)).num_kv_blocks
    assert blocks16 == GIB // (16 * bf16)
    assert blocks8 == GIB // (16 * int8)  # ~1.97x the 16-bit pool


def test_embedded_model_with_int8_kv_knows_paris():
    llm = LLM(device="cpu", kv_cache_dtype="int8", max_model_len=256, num_kv_blocks=32)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))
    assert out[0].text.startswith(" Paris")


@pytest.mark.gpu
def test_gpu_int8_kv_cuda_graphs_and_preemption(tiny_llama):
    """CUDA graphs (decode replays read the int8 cache through fixed scale views) agree with
    the eager path, and a preempting, chunking run finishes every request."""
    prompts = _prompts()
    kw = dict(device="cuda", dtype="float32", max_model_len=256, kv_cache_dtype="int8")
    graphs = LLM(str(tiny_llama), **kw)
    assert graphs.engine.runner.graphs is not None
    eager = LLM(str(tiny_llama), enforce_eager=True, **kw)
    a = [o.token_ids for o in graphs.generate(prompts, GREEDY)]
    b = [o.token_ids for o in eager.generate(prompts, GREEDY)]
    assert _agreement(a, b) >= 0.9
    tight = LLM(
        str(tiny_llama),
        num_kv_blocks=12,
        max_num_batched_tokens=24,
        max_num_seqs=8,
        **{**kw, "max_model_len": 180},
    )
    outs = tight.generate(prompts, GREEDY)
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    assert all(len(o.token_ids) == NEW_TOKENS for o in outs)


@pytest.mark.gpu
def test_gpu_embedded_model_with_int8_kv_knows_paris():
    try:
        default_model_path()
    except FileNotFoundError:
        pytest.skip("the embedded model's package is not installed here")
    llm = LLM(device="cuda", kv_cache_dtype="int8", max_model_len=512)
    out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=4, temperature=0))
    assert out[0].text.startswith(" Paris")
