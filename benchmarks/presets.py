"""Model presets, random prompts and workload sizes for the benchmarks: random-weight engines in
real shapes (profiles/models/NAME.json: public config values), seeded token-id workloads, and
the sizes of bench_gpu's workloads A-D per mode."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import torch

from appliance import model_presets

TINY_DIMS = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
)
TINY_MOE_DIMS = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
"""With TINY_DIMS, for presets with experts (and a shared expert of the same size where the
preset has one)."""
TINY_LINEAR_DIMS = dict(
    num_hidden_layers=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
)
"""With TINY_DIMS, for presets with linear-attention layers (Qwen3.5): three linear layers and
a full one (the preset's layer_types give way to full_attention_interval's default, 4)."""


def load_preset(name: str, tiny: bool = False) -> dict:
    """The config.json values of a model preset, by name (profiles/models/NAME.json);
    `tiny`: the same architecture with tiny dimensions (TINY_DIMS, and TINY_MOE_DIMS where it
    has experts; a listed layer_types, one per layer of the full depth, is dropped so the
    family's default pattern applies). The full vocabulary is kept (token-id prompts need no
    tokenizer), unlike `appliance serve`'s preset folders."""
    config = model_presets.load_preset(name)
    if not tiny:
        return config
    moe = dict(TINY_MOE_DIMS) if config.get("num_experts") else {}
    if moe and "top_k_experts" in config:  # Gemma 4's name for num_experts_per_tok
        moe["top_k_experts"] = moe["num_experts_per_tok"]
    if config.get("shared_expert_intermediate_size"):
        moe["shared_expert_intermediate_size"] = TINY_MOE_DIMS["moe_intermediate_size"]
    linear = TINY_LINEAR_DIMS if config.get("linear_num_value_heads") else {}
    tiny_config = {**config, **TINY_DIMS, **moe, **linear}
    tiny_config.pop("layer_types", None)
    return tiny_config


def materialise_preset(name: str, parent: str | Path, tiny: bool = False) -> Path:
    """A fresh model folder under `parent` holding only config.json: enough for an engine with
    load_format="random" (random weights, token-id prompts, no tokenizer)."""
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))
    (folder / "config.json").write_text(json.dumps(load_preset(name, tiny), indent=2))
    return folder


def random_lengths(n: int, lo: int, hi: int, seed: int) -> list[int]:
    """n lengths drawn from U[lo, hi] (seeded)."""
    return torch.randint(lo, hi + 1, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def random_prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    """n prompts of lengths U[lo, hi], token ids U[1, vocab) (never all zeros)."""
    g = torch.Generator().manual_seed(seed + 1)
    return [
        torch.randint(1, vocab, (k,), generator=g).tolist() for k in random_lengths(n, lo, hi, seed)
    ]


# Workload sizes per mode. "full" is the published workloads'; only full rows are judged against
# the targets (C also in "quick", where it is unchanged). "tiny" also shrinks the models (--tiny,
# on a CPU).
SIZES = {
    "full": dict(
        a_requests=256,
        a_prompt=(100, 1024),
        a_output=512,
        b_prompt=128,
        b_output=512,
        b_repeats=3,
        c_prompts=(1024, 4096),
        c_repeats=5,
        d_requests=256,
        d_prompt=(100, 1024),
        d_output=(100, 1024),
        hf_requests=64,
        hf_output=128,
    ),
    "tiny": dict(
        a_requests=4,
        a_prompt=(8, 32),
        a_output=8,
        b_prompt=16,
        b_output=8,
        b_repeats=2,
        c_prompts=(32, 64),
        c_repeats=2,
        d_requests=4,
        d_prompt=(8, 32),
        d_output=(4, 12),
        hf_requests=3,
        hf_output=4,
    ),
}
SIZES["quick"] = {
    **SIZES["full"],
    "a_requests": 32,
    "a_output": 128,
    "b_output": 128,
    "b_repeats": 1,
    "c_repeats": 3,
    "d_requests": 32,
    "d_output": (100, 256),
    "hf_requests": 16,
    "hf_output": 32,
}
