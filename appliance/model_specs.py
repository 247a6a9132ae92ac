"""ModelSpec: one model of a registry (`serve --model NAME=PATH`, `--models-dir DIR`, and the
config file's `[models.NAME]` tables), and the one place that reads those sources into specs.

A bare `--model PATH` (or none) is not a registry: the server runs one engine as it always
has. A registry starts when a `--model` names its model (`NAME=PATH`), when several are given,
or when `--models-dir` is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path

from appliance.options import SettingsError, attribute_docs


@dataclass(frozen=True)
class ModelSpec:
    """One served model and its own settings; the fields below are also the keys of its
    `[models.NAME]` table in the config file (except `name` and `path`)."""

    name: str
    """The name clients send as `model`."""
    path: str
    """A Hugging Face model folder, a .gguf file or a model-shape preset name."""
    quantization: str | None = None
    """The model's weight quantization (None = the server's setting or the checkpoint's)."""
    max_model_len: int | None = None
    """The model's longest sequence (None = the server's setting, else planned)."""
    max_num_seqs: int | None = None
    """The model's most sequences in a batch (None = the server's setting, else planned)."""
    num_kv_blocks: int | None = None
    """The model's KV-cache blocks (None = the server's setting, else planned)."""
    task: str | None = None
    """What the model serves: generate, embed or rerank (None = the server's setting, else
    read from its folder)."""
    gpu_memory_utilization: float | None = None
    """The share of the card's memory this model's engine may bring the card to, the models
    loaded before it included (None = the server's setting): with a chat model at 0.7, an
    embedding model at 0.8 takes a tenth of the card beside it."""
    pinned: bool = False
    """Loaded at start and never unloaded to make room or for idleness."""
    keep_alive: float | None = None
    """Seconds without requests after which the model is unloaded (None = stays loaded)."""
    aliases: list[str] = field(default_factory=list)
    """Other names clients may send for this model (globs allowed, like --model-alias)."""

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise SettingsError(f"model name {self.name!r} must be non-empty and have no '/'")
        if self.keep_alive is not None and not (
            self.keep_alive > 0 and math.isfinite(self.keep_alive)
        ):
            raise SettingsError(f"[models.{self.name}] keep_alive must be > 0 seconds")
        util = self.gpu_memory_utilization
        if util is not None and not (isinstance(util, (int, float)) and 0 < util <= 1):
            raise SettingsError(f"[models.{self.name}] gpu_memory_utilization must be in (0, 1]")
        for limit in ("max_model_len", "max_num_seqs", "num_kv_blocks"):
            value = getattr(self, limit)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise SettingsError(f"[models.{self.name}] {limit} must be a positive integer")

    @property
    def engine_pins(self) -> dict:
        """The engine settings this model pins over the server's."""
        names = (
            "quantization", "max_model_len", "max_num_seqs", "num_kv_blocks",
            "gpu_memory_utilization", "task",
        )  # fmt: skip
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


TABLE_KEYS = tuple(f.name for f in fields(ModelSpec) if f.name not in ("name", "path"))
"""The keys a `[models.NAME]` table may hold (ModelSpec's fields own the list)."""
MODEL_SUFFIXES = (".gguf",)


def is_registry(entries: list[str], models_dir: str | None) -> bool:
    """Whether these `--model` values and `--models-dir` ask for a registry."""
    return bool(models_dir) or len(entries) > 1 or any("=" in e for e in entries)


def model_specs(
    entries: list[str], models_dir: str | None, tables: dict[str, dict], default_name: str
) -> list[ModelSpec]:
    """The registry's models in order: each `--model NAME=PATH` (a bare PATH is named
    `default_name`, or its file name when several are given), then each model folder or .gguf
    file in `models_dir` (named by file name, without .gguf); `tables` add settings by name."""
    paths: dict[str, str] = {}
    for entry in entries:
        name, sep, path = (p.strip() for p in entry.partition("="))
        if not sep:
            name, path = (default_name if len(entries) == 1 else _file_name(entry)), entry
        if not name or not path:
            raise SettingsError(f"--model {entry!r} must be PATH or NAME=PATH")
        if name in paths:
            raise SettingsError(f"--model: the name {name!r} is given twice")
        paths[name] = path
    if models_dir:
        for name, path in _scan(Path(models_dir)):
            paths.setdefault(name, path)
    unknown = sorted(set(tables) - set(paths))
    if unknown:
        raise SettingsError(
            f"config file [models.{unknown[0]}] names no served model; served: {sorted(paths)}"
        )
    return [
        ModelSpec(name, path, **_table(name, tables.get(name, {}))) for name, path in paths.items()
    ]


def _table(name: str, table: dict) -> dict:
    if not isinstance(table, dict):
        raise SettingsError(f"config file [models.{name}] must be a table")
    extra = sorted(set(table) - set(TABLE_KEYS))
    if extra:
        docs = attribute_docs(ModelSpec)
        known = ", ".join(f"{k} ({docs.get(k, '')})" for k in TABLE_KEYS)
        raise SettingsError(
            f"config file [models.{name}]: unknown key {extra[0]!r}; known: {known}"
        )
    values = dict(table)
    if isinstance(values.get("aliases"), str):
        values["aliases"] = [values["aliases"]]
    if isinstance(values.get("keep_alive"), int):
        values["keep_alive"] = float(values["keep_alive"])
    return values


def _file_name(path: str) -> str:
    p = Path(path)
    return p.stem if p.suffix in MODEL_SUFFIXES else p.name


def _scan(folder: Path) -> list[tuple[str, str]]:
    """(name, path) of each model in `folder`: sub-folders with a config.json, .gguf files."""
    if not folder.is_dir():
        raise SettingsError(f"--models-dir {folder} is not a folder")
    found = []
    for child in sorted(folder.iterdir()):
        if (child.is_dir() and (child / "config.json").is_file()) or (
            child.is_file() and child.suffix in MODEL_SUFFIXES
        ):
            found.append((_file_name(str(child)), str(child)))
    if not found:
        raise SettingsError(f"--models-dir {folder} holds no model folder or .gguf file")
    return found
