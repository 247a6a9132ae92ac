"""Start-up's RoPE + KV-store fusion is judged once per attention shape, with that shape's RoPE
tables; layers that read another layer's K/V or rotate part of a head are left out."""

from __future__ import annotations

import torch
from transformers import Gemma4TextConfig

from engine.models.gemma4 import Gemma4ForCausalLM
from engine.models.model_config import FULL, SLIDING, ModelConfig
from engine.startup.kernel_choices import rope_store_groups


def test_gemma4_layers_group_by_shape_and_shared_layers_stay_out():
    hf = Gemma4TextConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        global_head_dim=64,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        num_kv_shared_layers=2,
        sliding_window=16,
        layer_types=[SLIDING, FULL] * 3,
        hidden_size_per_layer_input=0,
    )
    cfg = ModelConfig.from_dict({**hf.to_dict(), "architectures": ["Gemma4ForCausalLM"]})
    with torch.device("meta"):
        model = Gemma4ForCausalLM(cfg, max_positions=64)
    groups = rope_store_groups(model)
    layers = model.attention_layers()
    assert list(groups) == [(4, 2, 32), (4, 1, 64)]
    sliding_rope, sliding = groups[(4, 2, 32)]
    full_rope, full = groups[(4, 1, 64)]
    assert sliding == [layers[0], layers[2]] and full == [layers[1], layers[3]]
    assert sliding_rope is model.ropes[SLIDING] and full_rope is model.ropes[FULL]
