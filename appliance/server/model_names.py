"""The model names a request may send: the served model's own names, and the aliases of
`--model-alias NAME=SERVED` for clients that send names of their own (Claude Code sends
`claude-...`). NAME may be a glob (`claude-*`, `*`); the first alias that matches wins."""

from __future__ import annotations

from fnmatch import fnmatchcase

FLAG = "--model-alias"


def parse_alias(entry: str) -> tuple[str, str]:
    """(NAME, SERVED) of one `NAME=SERVED`; ValueError saying what is wrong."""
    name, sep, served = (part.strip() for part in entry.partition("="))
    if not sep or not name or not served:
        raise ValueError(f"{FLAG} {entry!r} must be NAME=SERVED, e.g. 'claude-*=my-model'")
    return name, served


def alias_target(aliases: list[tuple[str, str]], model: str) -> str | None:
    """The served name the first alias matching `model` (exactly or as a glob) maps it to."""
    for name, served in aliases:
        if model == name or fnmatchcase(model, name):
            return served
    return None


def unknown_model(model: str, served: str, target: str | None = None) -> str:
    """Why `model` names nothing here, and how to make it name the served model."""
    if target is not None:
        return (
            f"{FLAG} maps the model '{model}' to '{target}', which this server does not serve; "
            f"it serves '{served}'"
        )
    return (
        f"The model '{model}' does not exist; this server serves '{served}' (map other names "
        f"to it with {FLAG} NAME={served}, e.g. {FLAG} 'claude-*={served}')"
    )
