"""Model-shape presets (profiles/models/NAME.json), the one place that reads them: looking one
up by name, and turning one into a servable folder for random weights (its config.json plus the
embedded model's tokenizer), which `serve`, `profile` and the memory benchmark all use."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

PRESETS_DIR = Path(__file__).resolve().parent.parent / "profiles" / "models"
"""Where model-shape presets live, one config.json-like JSON file each."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def load_preset(name: str) -> dict:
    """The config.json values of the preset `name`; ValueError naming the known ones."""
    path = PRESETS_DIR / f"{name}.json"
    if not path.is_file():
        raise ValueError(f"no model preset {name!r}; known: {', '.join(preset_names())}")
    return json.loads(path.read_text())


def preset_path(model: str | None) -> Path | None:
    """The preset file when `model` names a preset and no file or folder of that name exists."""
    if not model or Path(model).expanduser().exists():
        return None
    path = PRESETS_DIR / f"{model}.json"
    return path if path.is_file() else None


def preset_folder(name: str, cache_root: Path | None = None) -> Path:
    """A model folder for the preset `name` that random weights can be served from: its
    config.json and the embedded SmolLM2 tokenizer, so text prompts work.

    The vocabulary is cut to the tokenizer's (49152 instead of e.g. 128256 for Llama-3): every
    token the random model samples then decodes to text, which a streaming client needs to see
    its first token (greedy decoding of random weights can otherwise loop on ids the tokenizer
    does not know). Only the embedding and LM head shrink; every layer keeps the preset's shape.
    Built once under `<cache root>/presets/NAME` ($APPLIANCE_CACHE_DIR, else
    ~/.cache/llm-appliance); a prepared folder there is used as it is (no embedded model needed).
    """
    from engine.models.gguf_loader import default_cache_root

    config = load_preset(name)
    folder = (cache_root or default_cache_root()) / "presets" / name
    if all((folder / f).is_file() for f in ("config.json", "tokenizer.json")):
        return folder
    from engine.models.loader import resolve_model_folder

    embedded = resolve_model_folder(None)  # the converted embedded model: tokenizer files
    tok = json.loads((embedded / "config.json").read_text())
    original_vocab = config["vocab_size"]
    config["vocab_size"] = tok["vocab_size"]
    for key in ("bos_token_id", "eos_token_id"):
        config[key] = tok.get(key)
    config["appliance_preset"] = {
        "name": name,
        "tokenizer": "embedded SmolLM2",
        "original_vocab_size": original_vocab,
    }
    tmp = folder.with_name(f".{name}.{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for file in TOKENIZER_FILES:
        if (embedded / file).is_file():
            shutil.copy2(embedded / file, tmp / file)
    (tmp / "config.json").write_text(json.dumps(config, indent=1))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder


def resolve_served_model(model: str | None, load_format: str) -> str | None:
    """What the engine should load for `appliance serve --model MODEL`: a preset name becomes
    its prepared folder (random weights only: a preset has no weights)."""
    if preset_path(model) is None:
        return model
    if load_format != "random":
        raise ValueError(
            f"{model!r} is a model-shape preset without weights: serve it with "
            "--load-format random, or pass a model folder or .gguf file"
        )
    return str(preset_folder(model))
