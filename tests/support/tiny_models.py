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
