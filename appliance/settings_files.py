"""The files `appliance serve` settings come from besides flags and the environment: the TOML
config file (read_toml) and a tuned profile's chosen values (tuned_values)."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

from appliance.options import Option, SettingsError


def tuned_values(name_or_path: str, tunable: Iterable[str]) -> dict:
    """The values a tuned profile chose for the `tunable` settings."""
    from appliance.loadgen.profile import load_tuned_profile

    try:
        profile = load_tuned_profile(name_or_path)
    except (OSError, ValueError, KeyError) as exc:
        raise SettingsError(f"cannot load tuned profile {name_or_path!r}: {exc}") from None
    chosen = dict(profile.chosen)
    if "max_num_seqs" not in chosen and "max_concurrency" in chosen:
        chosen["max_num_seqs"] = chosen["max_concurrency"]
    return {k: chosen[k] for k in tunable if chosen.get(k) is not None}


def read_toml(path: Path, known: dict[str, Option], tables: frozenset[str]) -> dict:
    """The settings of a config file: keys of `known` (dashes or underscores), at top level or
    under [serve], and the `tables` ([keys.NAME], [models.NAME]: checked where they are read)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingsError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    data = {**{k: v for k, v in data.items() if k != "serve"}, **data.get("serve", {})}
    out = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in tables:
            out[name] = value
            continue
        if name not in known:
            raise SettingsError(f"config file {path}: unknown setting {key!r}")
        out[name] = value
    return out
