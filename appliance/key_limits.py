"""KeyLimits: what one API key (or the anonymous class) may use, and the two ways to write it:
`key=value` words (a key file's line, --default-limits) and a TOML table (`[keys.NAME]`).

Every limit is optional (None = unlimited); the priority class is one of engine's PRIORITIES.
A bad value is a SettingsError naming the key, the field and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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

    @property
    def is_rate_limited(self) -> bool:
        """Whether responses carry x-ratelimit-* headers (an RPM or TPM limit is set)."""
        return self.rpm is not None or self.tpm is not None


LIMIT_NAMES = tuple(f.name for f in fields(KeyLimits))
_INT_NAMES = tuple(n for n in LIMIT_NAMES if n != "priority")


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
        number = value
        if isinstance(value, str) and value.strip().isdigit():
            number = int(value)
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise SettingsError(f"{prefix} must be a positive integer, got {value!r}")
        out[field_name] = number
    return KeyLimits(**out)


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
