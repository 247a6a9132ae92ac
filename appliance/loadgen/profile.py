"""Tuned profiles: the TOML that `appliance tune` writes (GPU, model, weight format, chosen
values, measured capacity, SLOs, soak verdict) and the helper that loads one by name or path."""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

TUNED_DIR = Path(__file__).resolve().parents[2] / "profiles" / "tuned"
"""Where profiles go by default and where a bare name is looked up."""


@dataclass
class TunedProfile:
    """One tuning result; every section is a flat table of scalars."""

    name: str
    hardware: dict = field(default_factory=dict)
    """gpu (name or 'cpu'), device."""
    model: dict = field(default_factory=dict)
    """name, dtype, quantization (the weight format)."""
    chosen: dict = field(default_factory=dict)
    """max_concurrency (the tuned cap), max_num_seqs, max_num_batched_tokens."""
    capacity: dict = field(default_factory=dict)
    """The measured figures at the chosen concurrency."""
    slo: dict = field(default_factory=dict)
    """The limits held: ttft_s, tpot_s, e2e_s (when set) and the percentile."""
    workload: dict = field(default_factory=dict)
    soak: dict = field(default_factory=dict)
    """duration_s, stable, and a note per drift found."""
    created: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.name):
            raise ValueError(f"profile name {self.name!r}: use letters, digits, '.', '_', '-'")

    @property
    def max_concurrency(self) -> int:
        return int(self.chosen["max_concurrency"])


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v) if isinstance(v, int) or v == v else '"nan"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    text = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def to_toml(profile: TunedProfile) -> str:
    """TOML text; None values are left out (TOML has no null)."""
    lines = [
        "# Written by `appliance tune`; load with `appliance serve --profile NAME`.",
        f"name = {_value(profile.name)}",
        f"created = {_value(profile.created)}",
    ]
    for section, table in asdict(profile).items():
        if not isinstance(table, dict):
            continue
        lines += ["", f"[{section}]"]
        lines += [f"{key} = {_value(v)}" for key, v in table.items() if v is not None]
    return "\n".join(lines) + "\n"


def write_tuned_profile(profile: TunedProfile, path: Path | None = None) -> Path:
    """Write to `path` (a .toml file or a folder) or profiles/tuned/NAME.toml."""
    path = Path(path) if path is not None else TUNED_DIR
    if path.suffix != ".toml":
        path = path / f"{profile.name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(to_toml(profile))
    return path


def load_tuned_profile(name_or_path: str | Path) -> TunedProfile:
    """A profile from a .toml path, or by name from profiles/tuned/."""
    path = Path(name_or_path)
    if path.suffix != ".toml" or not path.exists():
        candidate = TUNED_DIR / f"{path.name.removesuffix('.toml')}.toml"
        if not path.exists() and candidate.exists():
            path = candidate
    if not path.is_file():
        known = sorted(p.stem for p in TUNED_DIR.glob("*.toml")) if TUNED_DIR.is_dir() else []
        raise FileNotFoundError(f"no tuned profile {str(name_or_path)!r}; known: {known or 'none'}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc})") from None
    known_fields = set(TunedProfile.__dataclass_fields__)
    if "name" not in data or "max_concurrency" not in data.get("chosen", {}):
        raise ValueError(f"{path}: not a tuned profile (needs name and chosen.max_concurrency)")
    return TunedProfile(**{k: v for k, v in data.items() if k in known_fields})
