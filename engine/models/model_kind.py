"""What a model folder serves: "generate" (text), "embed" (vectors) or "rerank" (relevance
scores), and how an embedding model pools its hidden states. Read from the folder alone:
config.json's architectures, the sentence-transformers files (modules.json,
1_Pooling/config.json) and, for Qwen3-Reranker (a causal LM by its config), its name; or
what the engine's `task` setting says."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

KINDS = ("generate", "embed", "rerank")
"""Every model kind; EngineInfo.kind is one of them."""
POOLING_MODES = ("lasttoken", "mean", "cls")
"""The pooling rules of 1_Pooling/config.json (its pooling_mode_* keys) the engine knows."""


@dataclass(frozen=True)
class ModelKind:
    kind: str
    """One of KINDS."""
    pooling: str | None = None
    """An embedding model's pooling rule (one of POOLING_MODES); None for the other kinds."""


def _pooling_mode(folder: Path, default: str) -> str:
    path = folder / "1_Pooling" / "config.json"
    if not path.is_file():
        return default
    config = json.loads(path.read_text())
    for mode, key in (
        ("lasttoken", "pooling_mode_lasttoken"),
        ("cls", "pooling_mode_cls_token"),
        ("mean", "pooling_mode_mean_tokens"),
    ):
        if config.get(key):
            return mode
    return default


def model_kind(folder: str | Path, is_encoder: bool = True, task: str = "auto") -> ModelKind:
    """The kind of the model in `folder` (a Hugging Face folder with config.json), or `task`
    where it names one (EngineConfig.task: a reranker whose name does not say so). With
    is_encoder=False (the engine runs it as a decoder), ValueError for an embedding model whose
    pooling needs more than the last token's hidden state: a decoder runs a prompt in chunks
    and keeps only the last chunk's states."""
    kind = _read_kind(Path(folder))
    if task not in ("auto", kind.kind):
        kind = _as_task(Path(folder), task, is_encoder)
    if kind.kind == "embed" and kind.pooling != "lasttoken" and not is_encoder:
        raise ValueError(
            f"{folder} is a decoder embedding model with {kind.pooling} pooling; the engine "
            "pools decoders by their last token (1_Pooling/config.json pooling_mode_lasttoken)"
        )
    return kind


def _as_task(folder: Path, task: str, is_encoder: bool) -> ModelKind:
    """The kind a model is told to serve (task: one of KINDS)."""
    if task not in KINDS:
        raise ValueError(f"task must be one of auto, {', '.join(KINDS)}; got {task!r}")
    if task == "generate" and is_encoder:
        raise ValueError(f"{folder} is an encoder: it cannot generate text (task generate)")
    if task == "embed":
        return ModelKind("embed", _pooling_mode(folder, "mean" if is_encoder else "lasttoken"))
    return ModelKind(task)


def _read_kind(folder: Path) -> ModelKind:
    config = json.loads((folder / "config.json").read_text())
    archs = config.get("architectures") or []
    is_encoder = config.get("model_type") == "bert"
    if any(a.endswith("ForSequenceClassification") for a in archs):
        return ModelKind("rerank")
    names = f"{folder.name} {config.get('_name_or_path', '')}".lower()
    if "reranker" in names and any(a.endswith("ForCausalLM") for a in archs):
        return ModelKind("rerank")  # Qwen3-Reranker: the "yes" vs "no" logit
    has_st = (folder / "modules.json").is_file() or (folder / "1_Pooling").is_dir()
    if has_st or is_encoder or any(a.endswith("Model") for a in archs):
        return ModelKind("embed", _pooling_mode(folder, "mean" if is_encoder else "lasttoken"))
    return ModelKind("generate")
