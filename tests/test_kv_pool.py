"""The KV pool: one tensor per (KV heads, head dim) group of the layers that hold K/V, shared
layers bound to their source's views, and bytes equal to the KV formula's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.memory.kv_pool import KVPool
from engine.models.layers import PagedAttention
from engine.models.model_config import FULL, SLIDING, ModelConfig

BLOCKS, BLOCK_SIZE = 7, 4


def mixed_config(num_shared: int = 2) -> ModelConfig:
    """Six layers, sliding and full alternating; the full ones with 1 KV head of dim 64, the
    sliding ones with 2 of dim 32; the last `num_shared` read earlier layers' K/V."""
    base = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "vocab_size": 64,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
        }
    )
    return dataclasses.replace(
        base,
        layer_types=(SLIDING, FULL) * 3,
        sliding_window=8,
        global_head_dim=64,
        global_kv_heads=1,
        num_kv_shared_layers=num_shared,
    )


def layers_for(cfg: ModelConfig) -> list[PagedAttention]:
    return [
        PagedAttention(cfg.num_heads, a.num_kv_heads, a.head_dim)
        for a in map(cfg.layer_attention, range(cfg.num_layers))
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_groups_by_shape_and_shared_layers_read_their_source(dtype):
    cfg = mixed_config()
    assert [cfg.kv_source(i) for i in range(6)] == [None, None, None, None, 2, 3]
    layers = layers_for(cfg)
    pool = KVPool.allocate(cfg, layers, BLOCKS, BLOCK_SIZE, dtype, torch.device("cpu"))
    # layers 0 and 2 (sliding), 1 and 3 (full) hold K/V; 4 and 5 read 2 and 3
    assert [tuple(t.shape) for t in pool.tensors] == [
        (2, 2, BLOCKS, BLOCK_SIZE, 2, 32),
        (2, 2, BLOCKS, BLOCK_SIZE, 1, 64),
    ]
    assert layers[4].k_cache.data_ptr() == layers[2].k_cache.data_ptr()
    assert layers[5].v_cache.data_ptr() == layers[3].v_cache.data_ptr()
    assert layers[0].k_cache.data_ptr() != layers[2].k_cache.data_ptr()
    assert (layers[1].k_scales is not None) == (dtype == torch.int8)
    kv_name = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.int8: "int8"}[dtype]
    assert pool.nbytes == BLOCKS * BLOCK_SIZE * cfg.kv_cache_bytes_per_token(kv_name)
    KVPool.unbind(layers)
    assert all(a.k_cache is None and a.v_scales is None for a in layers)


def test_a_uniform_model_has_one_tensor_and_the_plain_formula():
    cfg = dataclasses.replace(mixed_config(0), global_head_dim=None, global_kv_heads=None)
    pool = KVPool.allocate(
        cfg, layers_for(cfg), BLOCKS, BLOCK_SIZE, torch.float16, torch.device("cpu")
    )
    assert [tuple(t.shape) for t in pool.tensors] == [(6, 2, BLOCKS, BLOCK_SIZE, 2, 32)]
    assert cfg.kv_cache_bytes_per_token("float16") == 2 * 6 * 2 * 32 * 2


def test_layers_that_disagree_with_the_config_are_refused():
    cfg = mixed_config()
    layers = layers_for(cfg)
    layers[1] = PagedAttention(cfg.num_heads, 2, 32)  # the config says 1 head of dim 64
    with pytest.raises(ValueError, match="config disagree"):
        KVPool.allocate(cfg, layers, BLOCKS, BLOCK_SIZE, torch.float32, torch.device("cpu"))
    with pytest.raises(ValueError, match="attention layers"):
        KVPool.allocate(cfg, layers[:5], BLOCKS, BLOCK_SIZE, torch.float32, torch.device("cpu"))


def test_sharing_needs_an_earlier_layer_of_the_same_type():
    cfg = dataclasses.replace(mixed_config(5), layer_types=(SLIDING,) + (FULL,) * 5)
    with pytest.raises(ValueError, match="no earlier layer of its type"):
        cfg.kv_source(1)
