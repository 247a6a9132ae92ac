"""API keys and KeyLimits: what one API key (or the anonymous class) may use, and the two ways
to write it: `key=value` words (a key file's line, --default-limits) and a TOML table
(`[keys.NAME]`); ApiKey, parsed from a flag, a key file's line or a table.

Every limit is optional (None = unlimited); the priority class is one of engine's PRIORITIES.
A bad value is a SettingsError naming the key, the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from appliance.options import SettingsError
from engine.sampling_params import PRIORITIES

ANONYMOUS = "anonymous"
"""The name requests without an API key are counted and limited under (keys off)."""


@dataclass(frozen=True)
class KeyLimits:
    """Limits of one key; None = unlimited."""

    max_concurrent: int | None = None
    """Most requests of this key in flight at once."""
    rpm: int | None = None
    """Requests admitted per minute (sliding 60 s window)."""
    tpm: int | None = None
    """Tokens per minute, prompt + output (sliding 60 s window)."""
    priority: str = PRIORITIES[0]
    """Scheduling class of the key's requests: one of PRIORITIES."""
    max_tokens: int | None = None
    """Largest max_tokens a request may ask for; an omitted max_tokens is clamped to it."""
    max_context: int | None = None
    """Largest prompt + max_tokens of one request."""
    weight: float = 1.0
    """The key's weight in the fair share between keys of its class: a key of weight 2 gets
    twice the tokens of a key of weight 1 when both wait."""


LIMIT_NAMES = tuple(f.name for f in fields(KeyLimits))


def limits_from(values: dict, key_name: str, where: str) -> KeyLimits:
    """KeyLimits from `values` (typed, from TOML, or text, from `key=value` words).
    Raises SettingsError naming `where`, the key, the field and what is allowed."""
    out: dict = {}
    for name, value in values.items():
        field_name = name.replace("-", "_")
        prefix = f"{where}: key {key_name!r}: {name}"
        if field_name not in LIMIT_NAMES:
            raise SettingsError(
                f"{where}: key {key_name!r}: unknown limit {name!r}; allowed: "
                + ", ".join(LIMIT_NAMES)
            )
        if field_name == "priority":
            if value not in PRIORITIES:
                raise SettingsError(f"{prefix} must be {' or '.join(PRIORITIES)}, got {value!r}")
            out[field_name] = value
            continue
        if field_name == "weight":
            out[field_name] = _weight(value, prefix)
            continue
        number = value
        if isinstance(value, str) and value.strip().isdigit():
            number = int(value)
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise SettingsError(f"{prefix} must be a positive integer, got {value!r}")
        out[field_name] = number
    return KeyLimits(**out)


def _weight(value, prefix: str) -> float:
    """A fair-share weight: a positive number (text from a key file, a number from TOML)."""
    try:
        number = float(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        number = None
    if number is None or not 0 < number < float("inf"):
        raise SettingsError(f"{prefix} must be a positive number, got {value!r}")
    return number


def parse_words(words: list[str], key_name: str, where: str) -> KeyLimits:
    """KeyLimits from words like `rpm=60 tpm=20000 priority=batch`."""
    values = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name or not value:
            raise SettingsError(
                f"{where}: key {key_name!r}: {word!r} is not a limit; write name=value with "
                f"name one of {', '.join(LIMIT_NAMES)}"
            )
        if name in values:
            raise SettingsError(f"{where}: key {key_name!r}: {name} is given twice")
        values[name] = value
    return limits_from(values, key_name, where)


def is_limit_word(word: str) -> bool:
    """Whether `word` reads as `name=value` with a limit's name (not as a key)."""
    name, sep, _ = word.partition("=")
    return bool(sep) and name.replace("-", "_") in LIMIT_NAMES


@dataclass(frozen=True)
class ApiKey:
    """One accepted API key; `name` appears in logs, the key never does."""

    name: str
    key: str = field(repr=False)
    limits: KeyLimits = field(default_factory=KeyLimits)
    """What the key may use (appliance.key_limits); unlimited by default."""
    admin: bool = False
    """The key may also load and unload models (--admin-key)."""


def parse_key(entry: str, sep: str | None, where: str) -> ApiKey:
    """`[NAME:]KEY` (sep ":") or a key file's line `KEY`, `NAME KEY` or `NAME KEY limits...`."""
    words: list[str] = []
    if sep:
        parts = entry.strip().split(sep, 1)
    else:
        parts, words = entry.split()[:2], entry.split()[2:]
        if len(parts) == 2 and is_limit_word(parts[1]):
            raise SettingsError(
                f"API key at {where}: a key with limits needs a name: NAME KEY name=value ..."
            )
    name, key = (parts[0].strip(), parts[1].strip()) if len(parts) == 2 else ("", parts[0])
    if len(key) < 8 or any(c.isspace() for c in key):
        raise SettingsError(f"API key at {where} must be at least 8 characters without spaces")
    return ApiKey(name, key, parse_words(words, name, where))


def with_tables(keys: list[ApiKey], tables: dict[str, dict]) -> list[ApiKey]:
    """`keys` with the config file's [keys.NAME] tables applied: a table with `key` adds that
    key, one without gives its limits to the key already named NAME; `admin = true` lets the
    key load and unload models."""
    by_name = {k.name: i for i, k in enumerate(keys)}
    if len(by_name) < len(keys):
        twice = sorted({k.name for k in keys if sum(j.name == k.name for j in keys) > 1})
        raise SettingsError(f"API key names must be unique; given more than once: {twice}")
    for name, table in tables.items():
        where = f"config file [keys.{name}]"
        if name == ANONYMOUS:
            raise SettingsError(
                f"{where}: {ANONYMOUS!r} names requests without a key; set their limits with "
                "default-limits and default-priority"
            )
        if not isinstance(table, dict):
            raise SettingsError(f'{where} must be a table of key = "..." and limits')
        values = dict(table)
        secret = values.pop("key", None)
        admin = values.pop("admin", None)  # may load and unload models (--admin-key)
        if admin is not None and not isinstance(admin, bool):
            raise SettingsError(f"{where}: admin must be true or false")
        limits = limits_from(values, name, where)
        if secret is None:
            if name not in by_name:
                raise SettingsError(
                    f'{where} has no key = "..." and no --api-key or --api-key-file key is '
                    f"named {name!r}; known names: {sorted(by_name) or 'none'}"
                )
            known = keys[by_name[name]]
            keys[by_name[name]] = replace(known, limits=limits, admin=bool(admin or known.admin))
            continue
        if name in by_name:
            raise SettingsError(f"{where}: a key named {name!r} is already given elsewhere")
        if not isinstance(secret, str):
            raise SettingsError(f"{where}: key must be a string")
        key = parse_key(f"{name}:{secret}", ":", where)
        by_name[name] = len(keys)
        keys.append(replace(key, limits=limits, admin=bool(admin)))
    return keys
