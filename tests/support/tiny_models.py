"""Builders of tiny random-weight Hugging Face models (saved with save_pretrained) plus a
byte-level tokenizer, for exactness tests against transformers."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

ARCHS = ("llama", "mistral", "qwen2", "qwen3")
VOCAB = 320  # 256 bytes + specials + spare ids
EOS_ID = 256

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=1024,
    eos_token_id=EOS_ID,
    bos_token_id=257,
    pad_token_id=258,
)


def tiny_config(arch: str):
    if arch == "llama":
        return LlamaConfig(
            **_COMMON,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 128,
            },
            rope_theta=500000.0,
            tie_word_embeddings=False,
        )
    if arch == "mistral":
        return MistralConfig(**_COMMON, sliding_window=None, tie_word_embeddings=False)
    if arch == "qwen2":
        return Qwen2Config(**_COMMON, tie_word_embeddings=True)
    if arch == "qwen3":
        return Qwen3Config(**_COMMON, head_dim=32, tie_word_embeddings=True)
    raise ValueError(arch)


def byte_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"<0x{i:02X}>": i for i in range(256)}
    vocab.update({"</s>": 256, "<s>": 257, "<pad>": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True, unk_token=None))
    tok.decoder = decoders.ByteFallback()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="</s>", bos_token="<s>", pad_token="<pad>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    return fast


def make_tiny_model(arch: str | PretrainedConfig, folder: Path, seed: int = 0) -> Path:
    """A tiny model of one of ARCHS, or of any transformers config (families with their own
    builder in tests/support pass theirs), with the byte tokenizer, saved in `folder`."""
    torch.manual_seed(seed)
    config = tiny_config(arch) if isinstance(arch, str) else arch
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: spread-out logits, no ties
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.08)
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return Path(folder)


def write_tiny_gguf(path: Path) -> None:
    """A 2-layer llama GGUF in float16 with its own (untied) output matrix."""
    import numpy as np
    from gguf import GGUFWriter, TokenType

    hidden, layers, heads, kv_heads, ffn = 64, 2, 4, 2, 128
    tokens = [chr(c) for c in range(33, 127)] + ["ab", "<s>", "</s>"]
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(layers)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([TokenType.NORMAL] * (len(tokens) - 2) + [TokenType.CONTROL] * 2)
    w.add_token_merges(["a b"])
    w.add_token_scores([0.0] * len(tokens))
    w.add_bos_token_id(len(tokens) - 2)
    w.add_eos_token_id(len(tokens) - 1)
    rng = np.random.default_rng(0)

    def f16(*shape):
        return (rng.standard_normal(shape) * 0.05).astype(np.float16)

    kv = kv_heads * hidden // heads
    w.add_tensor("token_embd.weight", f16(len(tokens), hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("output.weight", f16(len(tokens), hidden))
    for i in range(layers):
        for name, shape in [
            ("attn_q", (hidden, hidden)),
            ("attn_k", (kv, hidden)),
            ("attn_v", (kv, hidden)),
            ("attn_output", (hidden, hidden)),
            ("ffn_gate", (ffn, hidden)),
            ("ffn_up", (ffn, hidden)),
            ("ffn_down", (hidden, ffn)),
        ]:
            w.add_tensor(f"blk.{i}.{name}.weight", f16(*shape))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
