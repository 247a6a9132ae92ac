"""Lone surrogates: code points U+D800-U+DFFF, which a Python str can hold (JSON's "\\ud800"
escape puts one there) and no UTF-8 text can. Tokenizers and the grammar library take UTF-8, so
each place where text enters them checks here first and refuses such text with a ValueError
that says where it is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def find_surrogate(text: str) -> int | None:
    """The index of the first surrogate code point in `text`, or None when it has none."""
    if text.isascii():
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


@dataclass(frozen=True)
class Surrogate:
    """Where a decoded JSON value holds a surrogate: the string at `path` (a key of the object
    at `path` when `in_key`), `index` characters into it."""

    path: tuple[str | int, ...]
    index: int
    char: str
    in_key: bool = False

    def describe(self, root: str = "", whole: str = "the top-level object") -> str:
        """E.g. "messages[0].content is not valid Unicode: ...": the place is `path` under
        `root`, the value's own name ("" for a request body, whose fields name themselves);
        `whole` names the value where a key of its top level is at fault."""
        place = json_path((root, *self.path) if root else self.path)
        if self.in_key:
            place = f"a key of {place or whole}"
        return (
            f"{place} is not valid Unicode: it holds a lone surrogate "
            f"(U+{ord(self.char):04X}) at character {self.index}; send text as UTF-8, with "
            "\\u escapes only for whole surrogate pairs"
        )


def find_in_value(value: Any) -> Surrogate | None:
    """The first surrogate, in document order, of any string in a decoded JSON value (object
    keys included; a bare str is a value too), or None. Iterative, so a value nested as deep
    as json.loads allows is walked without running out of stack."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if path and isinstance(path[-1], str):  # an object's member: its key comes first
            index = find_surrogate(path[-1])
            if index is not None:
                return Surrogate(path[:-1], index, path[-1][index], in_key=True)
        if isinstance(item, str):
            index = find_surrogate(item)
            if index is not None:
                return Surrogate(path, index, item[index])
        elif isinstance(item, dict):
            stack.extend((item[k], (*path, k)) for k in reversed(list(item)))
        elif isinstance(item, list | tuple):
            stack.extend((item[i], (*path, i)) for i in reversed(range(len(item))))
    return None


def check(value: Any, name: str) -> None:
    """ValueError naming the place (`name` and the path under it, e.g. "messages[0].content")
    when `value` (a str, or a decoded JSON value) holds a surrogate in any string."""
    found = find_in_value(value)
    if found is not None:
        raise ValueError(found.describe(name))


def json_path(loc: tuple | list) -> str:
    """('messages', 0, 'role') -> 'messages[0].role'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out
