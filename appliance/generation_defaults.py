"""Requests' defaults for the sampling fields they omit: the model's own (generation_config.json,
or a GGUF file's general.sampling.* metadata), the operator's overrides, else the engine's.

Precedence, per field: the request's value > --override-generation-config > the model's
file (--generation-config auto|PATH; none skips it) > SamplingParams' defaults (max_tokens:
the endpoint's own default). The front end applies them (appliance.server.protocol), so every
request's trace and log line show the values it ran with and where each came from.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from pathlib import Path

from appliance.options import SettingsError
from engine.sampling_params import SamplingParams

logger = logging.getLogger("appliance.server")

DEFAULTED = ("temperature", "top_p", "top_k", "repetition_penalty", "max_tokens")
"""The request fields that take a model's default when omitted."""
FILE_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}
"""transformers' GenerationConfig field -> the request field it sets (also the override keys)."""
GGUF_KEYS = {
    "SAMPLING_TEMP": "temperature",
    "SAMPLING_TOP_P": "top_p",
    "SAMPLING_TOP_K": "top_k",
    "SAMPLING_PENALTY_REPEAT": "repetition_penalty",
}
"""gguf.constants.Keys.General's sampling keys -> request field (GGUF has no max-tokens key)."""
INTEGER_FIELDS = ("top_k", "max_tokens")
SOURCES = ("request", "override", "model", "server")
"""Where an effective value came from, as traces and the request log name it."""


def server_defaults() -> dict[str, float | int]:
    """The engine's own defaults (SamplingParams) for the defaulted fields."""
    return {f.name: f.default for f in fields(SamplingParams) if f.name in DEFAULTED}


@dataclass(frozen=True)
class GenerationDefaults:
    """What an omitted field becomes: `values` (request field -> value) from `sources` (field ->
    "override" or "model"); a field in neither takes the server's default."""

    values: dict[str, float | int] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    origin: str = "none"
    """The model file read (a path), or why none was ("--generation-config none", ...)."""

    def describe(self) -> str:
        """One line for the start-up log: each field's default and where it came from."""
        ours = server_defaults()
        parts = []
        for name in DEFAULTED:
            if name in self.values:
                parts.append(f"{name}={self.values[name]} ({self.sources[name]})")
            elif name == "max_tokens":
                parts.append("max_tokens=16 for completions, the rest of the context for chat")
            else:
                parts.append(f"{name}={ours[name]}")
        return f"request defaults: {', '.join(parts)}; model file: {self.origin}"

    def as_dict(self) -> dict:
        """For /v1/stats: every defaulted field's value and source (max_tokens may be None:
        the endpoint's default)."""
        ours = server_defaults()
        return {
            name: {
                "value": self.values.get(name, None if name == "max_tokens" else ours[name]),
                "source": self.sources.get(name, "server"),
            }
            for name in DEFAULTED
        }


def check_source(source: str) -> None:
    """--generation-config is none, auto or a path that exists; SettingsError otherwise."""
    if source not in ("none", "auto") and not Path(source).expanduser().exists():
        raise SettingsError(
            f"--generation-config {source}: no such file or folder; pass none, auto, a "
            "generation_config.json, a model folder holding one, or a .gguf file"
        )


def parse_overrides(text: str | None) -> dict[str, float | int]:
    """--override-generation-config: a JSON object of generation_config.json fields, checked;
    returned under the request's field names. Raises SettingsError saying what to change."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SettingsError(
            f"override_generation_config is not valid JSON ({exc.msg} at column {exc.colno}): "
            f"""write an object such as '{{"temperature": 0.6, "top_p": 0.9}}'"""
        ) from None
    if not isinstance(data, dict):
        raise SettingsError(
            "override_generation_config must be a JSON object such as "
            f"""'{{"temperature": 0.6}}', got {text!r}"""
        )
    unknown = sorted(set(data) - set(FILE_NAMES))
    if unknown:
        raise SettingsError(
            f"override_generation_config: unknown field(s) {', '.join(unknown)}; allowed: "
            f"{', '.join(FILE_NAMES)}"
        )
    values = {FILE_NAMES[k]: v for k, v in data.items()}
    return _checked(values, "override_generation_config")


def _checked(values: dict, where: str) -> dict[str, float | int]:
    """`values` (request field names) if each is a number in the range SamplingParams takes."""
    for name, value in values.items():
        integer = name in INTEGER_FIELDS
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            kind = "an integer" if integer else "a number"
            raise SettingsError(f"{where}: {_file_name(name)} must be {kind}, got {value!r}")
    try:
        SamplingParams(**values)
    except ValueError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    return {k: (v if k in INTEGER_FIELDS else float(v)) for k, v in values.items()}


def _file_name(name: str) -> str:
    return next(k for k, v in FILE_NAMES.items() if v == name)


def load_generation_defaults(
    source: str, model: str | None, overrides: dict[str, float | int]
) -> GenerationDefaults:
    """The defaults for `source` ("none", "auto": the model's own file, or a path to a
    generation_config.json, its folder or a .gguf file) with `overrides` on top. `model` is
    the served model as configured (None = the embedded one). Raises SettingsError for a
    path that does not exist or a file that cannot be read."""
    if source == "none":
        values, origin = {}, "none (--generation-config none)"
    elif source == "auto":
        path = _model_path(model)
        if path is None:
            values, origin = {}, f"none ({model!r} is not a model folder or .gguf file)"
        else:
            values, origin = _read(path)
    else:
        check_source(source)
        values, origin = _read(Path(source).expanduser(), required=True)
    sources = {name: "model" for name in values}
    values.update(overrides)
    sources.update({name: "override" for name in overrides})
    return GenerationDefaults(values, sources, origin)


def _model_path(model: str | None) -> Path | None:
    if model is None:
        from engine.models.embedded import default_model_path

        try:
            return default_model_path()
        except FileNotFoundError:
            return None
    path = Path(model).expanduser()
    return path if path.exists() else None  # a preset name (random weights) has no file


def _read(path: Path, required: bool = False) -> tuple[dict, str]:
    """(values under request field names, the file read or why none was). `required`: a folder
    without generation_config.json is an error (it was named on purpose)."""
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _read_gguf(path)
    file = path / "generation_config.json" if path.is_dir() else path
    if not file.is_file():
        if required:
            raise SettingsError(
                f"--generation-config {path}: the folder has no generation_config.json"
            )
        return {}, f"none ({path} has no generation_config.json)"
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise SettingsError(f"cannot read {file}: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{file} is not a JSON object")
    values = {FILE_NAMES[k]: v for k, v in data.items() if k in FILE_NAMES and v is not None}
    if data.get("do_sample") is False:
        # transformers decodes greedily when do_sample is false, whatever temperature says.
        values["temperature"] = 0.0
    return _checked(values, str(file)), str(file.resolve())


def _read_gguf(path: Path) -> tuple[dict, str]:
    from gguf.constants import Keys

    from engine.models.gguf_metadata import read_gguf_metadata

    try:
        meta = read_gguf_metadata(path, "general.sampling.")
    except (OSError, ValueError) as exc:
        raise SettingsError(f"cannot read the metadata of {path}: {exc}") from None
    names = {getattr(Keys.General, key): name for key, name in GGUF_KEYS.items()}
    # float32 in the file: 0.6 reads back as 0.60000002384; keep the digits a float32 holds.
    values = {
        names[k]: float(f"{v:.7g}") if isinstance(v, float) else v
        for k, v in meta.items()
        if k in names
    }
    where = str(path.resolve())
    if not values:
        where += " (no general.sampling.* metadata)"
    return _checked(values, str(path)), where
