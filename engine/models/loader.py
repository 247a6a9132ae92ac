"""Model loading: resolve what the user named (nothing, a .gguf file, a Hugging Face folder)
to a Hugging Face folder, then build our model and fill it from its safetensors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.config import ModelConfig
from engine.models.llama import LlamaForCausalLM
from engine.models.quant import WeightQuant, quantize_model


def resolve_model_folder(model: str | Path | None) -> Path:
    """None -> the embedded default; a .gguf file -> its cached conversion; else a folder."""
    if model is None:
        from engine.models.embedded import default_model_path

        model = default_model_path()
    path = Path(model).expanduser()
    if not path.exists():
        raise ValueError(
            f"model {str(model)!r} not found: expected a Hugging Face model folder "
            "(config.json, *.safetensors, tokenizer files) or a .gguf file"
        )
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ValueError(
                f"model file {path} is not a .gguf file; pass a .gguf file or a "
                "Hugging Face model folder"
            )
        from engine.models.gguf_loader import gguf_to_hf_folder

        return gguf_to_hf_folder(path)
    return path


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [folder / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names shard(s) that are missing: {missing}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(
            f"model folder {folder} has no *.safetensors weights "
            "(expected model.safetensors or a sharded index)"
        )
    return files


def iter_safetensors(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    for file in _safetensors_files(folder):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_model(
    folder: Path,
    cfg: ModelConfig,
    max_positions: int,
    dtype: torch.dtype,
    device: torch.device,
    random_weights: bool = False,
    quant: WeightQuant | None = None,
) -> LlamaForCausalLM:
    """Build the model on `device` in `dtype` and load its weights (or draw random ones);
    with `quant`, the projections are then quantized (or, for a checkpoint bitsandbytes
    already quantized, read as they are)."""
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg, max_positions)
    model = model.to_empty(device=device).to(dtype=dtype)
    # Buffers (RoPE tables) were on meta: rebuild them on the device, in fp32.
    rope = type(model.rope)(cfg.head_dim, max_positions, cfg.rope_theta, cfg.rope_scaling)
    model.rope.cos, model.rope.sin = rope.cos.to(device), rope.sin.to(device)
    if quant is not None and quant.prequantized and not random_weights:
        from engine.models.bnb_checkpoint import convert_bnb_weights

        quantize_model(model, quant, empty=True)
        model.load_weights(convert_bnb_weights(iter_safetensors(folder), quant))
    elif random_weights:
        init_random_weights(model)
    else:
        model.load_weights(iter_safetensors(folder))
    if quant is not None and (random_weights or not quant.prequantized):
        quantize_model(model, quant)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.eval()


@torch.no_grad()
def init_random_weights(model: LlamaForCausalLM, seed: int = 0) -> None:
    """Random weights in real shapes, for speed and memory benchmarks (never zeros)."""
    gen = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    for name, param in model.named_parameters():
        if "norm" in name:
            param.fill_(1.0)
        else:
            param.normal_(0.0, 0.02, generator=gen)
