"""After LLMEngine's start-up (graph capture, warm-up), a mixed serving load builds no Triton
kernel variant: prompts of 1 to ~1,000 tokens (every power-of-two boundary among them), decode
batches of every size from 1 to max_num_seqs, staggered arrivals that mix decodes with prefill
chunks, chunked long prompts, preemption from a small KV pool, and greedy, seeded and sampled
requests with every sampling feature and logprobs. In bf16, with int8 and int4 weights and
with an int8 KV cache. A failure lists each variant built after warm-up (kernel, constexprs,
specialisations: engine/runner/compile_count.py)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from engine import SamplingParams
from engine.llm_engine import LLMEngine
from engine.runner import compile_count
from tests.support.tiny_models import VOCAB, byte_tokenizer

pytestmark = pytest.mark.gpu
MAX_NUM_SEQS = 32
BOUNDARY_LENGTHS = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257]
BOUNDARY_LENGTHS += [511, 512, 513, 1000]


@pytest.fixture(scope="module")
def small_llama(tmp_path_factory):
    """A random Llama with Llama-3-8B's head shape (head_dim 128, 4 query heads a KV head)
    in two small layers, and the tests' byte tokenizer."""
    folder = tmp_path_factory.mktemp("small-llama")
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=2048,
        rope_theta=500000.0,
        eos_token_id=256,
        bos_token_id=257,
        pad_token_id=258,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def _params(rng: random.Random) -> SamplingParams:
    """Greedy, seeded, and every sampling feature alone and together, some with logprobs."""
    max_tokens = rng.choice([1, 2, 5, 16, 64])
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.0, logprobs=3),
        dict(temperature=0.9, seed=rng.randrange(1000)),
        dict(temperature=0.7, top_k=20),
        dict(temperature=0.7, top_p=0.8),
        dict(temperature=0.7, min_p=0.05),
        dict(temperature=0.7, repetition_penalty=1.2),
        dict(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.5),
        dict(
            temperature=0.8,
            top_k=50,
            top_p=0.9,
            min_p=0.01,
            repetition_penalty=1.1,
            presence_penalty=0.1,
            frequency_penalty=0.1,
            logprobs=5,
            seed=7,
        ),
    ]
    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, **rng.choice(kinds))


def _prompt(rng: random.Random, length: int) -> list[int]:
    return [rng.randrange(256) for _ in range(length)]


def _serve(engine: LLMEngine) -> None:
    rng = random.Random(0)
    count = 0

    def add(length: int, params: SamplingParams) -> None:
        nonlocal count
        engine.add_request(f"load-{count}", _prompt(rng, length), params)
        count += 1

    def drain() -> None:
        while engine.has_unfinished():
            engine.step()

    # Decode batches of every size: n short prompts at once, decoding together.
    for n in range(1, MAX_NUM_SEQS + 1):
        for _ in range(n):
            add(rng.randint(1, 40), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
        drain()
    # Every boundary length alone, then beside running decodes.
    for length in BOUNDARY_LENGTHS:
        add(length, _params(rng))
        drain()
    for length in BOUNDARY_LENGTHS:
        add(rng.randint(1, 100), SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        engine.step()
        add(length, _params(rng))
        engine.step()
    drain()
    # Staggered random arrivals: mixed steps of many sizes, chunked prompts, preemption.
    for _ in range(300):
        for _ in range(rng.choice([0, 0, 1, 1, 2, 5])):
            add(rng.randint(1, 1000), _params(rng))
        engine.step()
    drain()


CASES = {
    "bf16": {},
    "int8-weights": dict(quantization="int8"),
    "int4-weights": dict(quantization="int4"),
    "int8-kv": dict(kv_cache_dtype="int8"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_no_kernel_compiles_after_warmup(small_llama, case):
    if not compile_count.install():
        pytest.skip("this Triton has no compilation listener: compiles cannot be counted")
    if "quantization" in CASES[case] and importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes is not installed")
    engine = LLMEngine(
        small_llama,
        device="cuda",
        dtype="bfloat16",
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=2048,
        max_num_batched_tokens=1024,
        num_kv_blocks=400,  # 6,400 tokens: 32 sequences of up to 1,064 preempt each other
        seed=0,
        **CASES[case],
    )
    assert engine.runner.graphs is not None
    _serve(engine)
    stats = engine.stats()
    assert stats["generation_tokens_total"] > 0
    built = engine.compiles_after_warmup()
    assert stats["compiles_after_warmup"] == 0, "\n".join(built)
    print(f"{case}: {stats['num_preemptions_total']} preemptions, {stats['num_steps']} steps")
