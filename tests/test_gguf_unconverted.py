"""GGUF files that transformers 5.24 cannot convert faithfully are refused with a clear error:
Gemma 4 (it reads none of its own keys: soft-cap, K/V sharing, layer pattern, the sliding
layers' head dim, per-layer KV heads, experts) and gpt-oss (it loads, but maps none of
llama.cpp's stacked experts, their biases or the attention sinks: they would be random). Each
tiny file is laid out as llama.cpp's converter writes one (tensor names from the gguf package's
tables for the architecture; Gemma 4's keys as llama.cpp's convert_hf_to_gguf.py Gemma4Model
writes them: KV heads per layer, key_length for the full layers and key_length_swa for the
sliding ones, the sliding-window pattern)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.models.gguf_loader import gguf_to_hf_folder

HIDDEN = 64
TOKENS = ["<pad>", "<eos>", "<bos>"] + [chr(c) for c in range(33, 127)]


def _writer(path, arch: str, layers: int):
    from gguf import GGUFWriter, TokenType

    w = GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_token_list(TOKENS)
    w.add_token_scores([0.0] * len(TOKENS))
    w.add_token_types([TokenType.CONTROL] * 3 + [TokenType.NORMAL] * (len(TOKENS) - 3))
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    return w


def _finish(w, tensors: dict[str, tuple[int, ...]]) -> None:
    rng = np.random.default_rng(0)
    for name, shape in tensors.items():
        w.add_tensor(name, (rng.standard_normal(shape) * 0.08).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_gemma4(path, moe: bool) -> None:
    """Five sliding layers (head dim 16, 2 KV heads) and a full one (head dim 32, one KV head,
    V = K: no attn_v), as gemma-4-31B / 26B-A4B lay theirs out; with `moe`, 26B-A4B's experts."""
    heads, kv, head_dim, global_dim, ffn = 4, 2, 16, 32, 96
    w = _writer(path, "gemma4", 6)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv([kv] * 5 + [1])
    w.add_key_length(global_dim)
    w.add_value_length(global_dim)
    w.add_key_length_swa(head_dim)
    w.add_value_length_swa(head_dim)
    w.add_sliding_window(8)
    w.add_sliding_window_pattern([True] * 5 + [False])
    w.add_embedding_length_per_layer_input(0)
    if moe:
        w.add_expert_count(4)
        w.add_expert_used_count(2)
        w.add_expert_feed_forward_length(32)
    tensors = {"token_embd.weight": (len(TOKENS), HIDDEN), "output_norm.weight": (HIDDEN,)}
    for i in range(6):
        (d, k), blk = (global_dim, 1) if i == 5 else (head_dim, kv), f"blk.{i}"
        tensors |= {
            f"{blk}.attn_q.weight": (heads * d, HIDDEN),
            f"{blk}.attn_k.weight": (k * d, HIDDEN),
        }
        if i != 5:
            tensors[f"{blk}.attn_v.weight"] = (k * d, HIDDEN)
        tensors |= {f"{blk}.attn_output.weight": (HIDDEN, heads * d)}
        tensors |= {f"{blk}.ffn_{p}.weight": (ffn, HIDDEN) for p in ("gate", "up")}
        tensors |= {f"{blk}.ffn_down.weight": (HIDDEN, ffn)}
        if moe:
            tensors |= {
                f"{blk}.ffn_gate_inp.weight": (4, HIDDEN),
                f"{blk}.ffn_gate_up_exps.weight": (4, 64, HIDDEN),
                f"{blk}.ffn_down_exps.weight": (4, HIDDEN, 32),
            }
        tensors |= {f"{blk}.attn_{n}_norm.weight": (d,) for n in ("q", "k")}
        norms = ["attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"]
        norms += ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] if moe else []
        tensors |= {f"{blk}.{n}.weight": (HIDDEN,) for n in norms}
    _finish(w, tensors)


def _write_gpt_oss(path) -> None:
    """gpt-oss-20b's layout at tiny size: head dim 64 (its own), 4 experts, top-2, biases and
    sinks, the experts stacked per projection (ffn_{gate,up,down}_exps) as llama.cpp keeps
    them."""
    heads, kv, head_dim, experts, inter = 4, 2, 64, 4, 32
    w = _writer(path, "gpt-oss", 2)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(150_000.0)
    w.add_expert_count(experts)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(inter)
    tensors = {
        "token_embd.weight": (len(TOKENS), HIDDEN),
        "output.weight": (len(TOKENS), HIDDEN),
        "output_norm.weight": (HIDDEN,),
    }
    q, k = heads * head_dim, kv * head_dim
    for i in range(2):
        blk = f"blk.{i}"
        for name, rows, cols in [
            ("attn_q", q, HIDDEN),
            ("attn_k", k, HIDDEN),
            ("attn_v", k, HIDDEN),
            ("attn_output", HIDDEN, q),
            ("ffn_gate_inp", experts, HIDDEN),
        ]:
            tensors |= {f"{blk}.{name}.weight": (rows, cols), f"{blk}.{name}.bias": (rows,)}
        for name, rows, cols in [
            ("gate", inter, HIDDEN),
            ("up", inter, HIDDEN),
            ("down", HIDDEN, inter),
        ]:
            tensors[f"{blk}.ffn_{name}_exps.weight"] = (experts, rows, cols)
            tensors[f"{blk}.ffn_{name}_exps.bias"] = (experts, rows)
        tensors |= {f"{blk}.attn_sinks.weight": (heads,)}
        tensors |= {f"{blk}.{n}.weight": (HIDDEN,) for n in ("attn_norm", "post_attention_norm")}
    _finish(w, tensors)


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_a_gemma4_gguf_is_refused_with_the_reason(tmp_path, moe):
    path = tmp_path / "tiny-gemma4.gguf"
    _write_gemma4(path, moe)
    with pytest.raises(ValueError, match=r"'gemma4'.*final_logit_softcapping.*Hugging Face"):
        gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache" / "gguf").iterdir())  # no folder, no temp left


def test_transformers_still_ignores_gemma4_gguf_keys(tmp_path):
    """Why UNFAITHFUL_GGUF refuses Gemma 4: the config transformers builds from the file lacks
    the soft-cap, the K/V sharing, the experts and the sliding layers' head dim, and takes the
    per-layer KV-head list for one count. When this fails, transformers reads them: lift the
    refusal and test the conversion against transformers as tests/test_gemma3.py does."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = tmp_path / "tiny-gemma4.gguf"
    _write_gemma4(path, moe=True)
    config = load_gguf_checkpoint(str(path), return_tensors=False)["config"]
    assert config["model_type"] == "gemma4_text" and config["global_head_dim"] == 32
    read = {"final_logit_softcapping", "num_kv_shared_layers", "num_experts", "head_dim"}
    assert not read & set(config)
    assert config["num_key_value_heads"] == [2] * 5 + [1]


def test_a_gpt_oss_gguf_is_refused_rather_than_given_random_experts(tmp_path):
    """transformers converts it but maps none of the stacked experts, their biases or the
    sinks (its GptOssTensorProcessor expects other tensor names): 10 weights would be random."""
    path = tmp_path / "tiny-gpt-oss.gguf"
    _write_gpt_oss(path)
    with pytest.raises(ValueError, match=r"'gpt-oss'.*leaves 10 weights without a value") as err:
        gguf_to_hf_folder(path, cache_dir=tmp_path / "cache")
    assert "model.layers.0.mlp.experts.gate_up_proj," in str(err.value)
    assert "model.layers.0.self_attn.sinks" in str(err.value)
    assert not list((tmp_path / "cache" / "gguf").iterdir())
