"""Settings described once, by a dataclass: `Option` (name, type hint, default, help text from
the field's attribute docstring, choices from a Literal hint) and what is made from it:
argparse flags (--name-with-dashes), values read from APPLIANCE_<NAME> environment variables,
and the check of a value against the field's type.

pydantic converts and checks the values against the type hints, so there is no hand-written
coercion: lax for text (an environment variable or a flag's argument: "8" -> 8, "a,b" -> ["a",
"b"] for a list; a boolean variable is read by engine.env, as every switch is: "yes"/"on"/"1"
-> True), strict for values that arrive typed (TOML, Python callers: "8" is refused where an
int is wanted, an int is taken for a float). The settings themselves stay plain dataclasses, so
`dataclasses.replace`, `fields()` and `__post_init__` work as they do everywhere else in the
code. Attribute docstrings are read with ast because pydantic reads them only from its own
models, and EngineConfig is a plain dataclass.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import textwrap
import types
import typing
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from engine.env import parse_flag

ENV_PREFIX = "APPLIANCE_"


class SettingsError(ValueError):
    """A setting is invalid; the message says which and how to fix it."""


@dataclass(frozen=True)
class Option:
    """One setting: a dataclass field seen as a flag, an environment variable and a TOML key."""

    name: str
    hint: Any
    """The field's type, e.g. `int | None`, `list[str]`, `Literal["a", "b"] | None`."""
    default: Any
    help: str
    """The field's docstring, on one line."""
    metavar: str | None = None
    """The flag's argument name in --help (field metadata "metavar"); None = argparse's."""
    repeatable: bool = False
    """A value that is not a list may still be given several times, becoming a list (field
    metadata "repeatable": `--model` names one model, or several as NAME=PATH)."""

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @cached_property
    def item(self) -> Any:
        """The hint without None and Annotated extras; a list's element type."""
        hint = _unwrap(self.hint)
        return _unwrap(typing.get_args(hint)[0]) if self.is_list else hint

    @cached_property
    def is_list(self) -> bool:
        return typing.get_origin(_unwrap(self.hint)) is list

    @cached_property
    def choices(self) -> tuple | None:
        return typing.get_args(self.item) if typing.get_origin(self.item) is Literal else None

    @cached_property
    def expected(self) -> str:
        """What a valid value is, in words: "int", "list of str", "auto or random"."""
        if self.choices:
            *head, last = map(str, self.choices)
            return f"{', '.join(head)} or {last}" if head else last
        name = getattr(self.item, "__name__", str(self.item))
        return f"list of {name}" if self.is_list else name

    @cached_property
    def _adapter(self) -> TypeAdapter:
        return TypeAdapter(self.hint)

    @cached_property
    def _item_adapter(self) -> TypeAdapter:
        return TypeAdapter(self.item)

    def check(self, value: Any) -> Any:
        """`value` converted to the field's type (strictly: it arrived typed); a lone string is
        taken as a one-item list. Raises SettingsError naming the setting."""
        if self.is_list and isinstance(value, str):
            value = [value]
        try:
            return self._adapter.validate_python(value, strict=True)
        except ValidationError:
            raise SettingsError(
                f"setting {self.name} must be {self.expected}, got {value!r}"
            ) from None

    def parse(self, text: str, where: str) -> Any:
        """The value `text` stands for (an environment variable: a list is comma-separated).
        Raises SettingsError naming `where` and what is allowed."""
        if self.item is bool and not self.is_list:
            try:
                return parse_flag(text, where)  # the words every boolean variable takes
            except ValueError as e:
                raise SettingsError(str(e)) from None
        value = [p.strip() for p in text.split(",") if p.strip()] if self.is_list else text
        try:
            return self._adapter.validate_python(value)
        except ValidationError:
            if self.choices:
                raise SettingsError(
                    f"{where}={text!r}: {self.name} must be {self.expected}"
                ) from None
            raise SettingsError(f"{where}={text!r} is not a valid {self.expected}") from None

    def _flag_value(self, text: str) -> Any:
        """A flag's argument (one item of a repeated flag) as a value."""
        try:
            adapter = self._item_adapter if self.is_list else self._adapter
            return adapter.validate_python(text)
        except ValidationError:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: must be {self.expected}"
            ) from None

    def add_flag(self, parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
        """Add this setting's flag: a bool that defaults to False is `--name`; any other bool
        is `--name/--no-name`; a list repeats the flag. An unset flag leaves `dest` at the
        parser's default (None, or absent under argument_default=SUPPRESS)."""
        help_text = self.help
        if self.is_list or self.repeatable:
            help_text += " Repeatable."
        elif self.default is not None and not isinstance(self.default, bool):
            help_text += f" Default: {self.default}."
        kwargs: dict[str, Any] = {"dest": self.name, "help": help_text.replace("%", "%%")}
        if self.item is bool and not self.is_list:
            kwargs["action"] = (
                "store_true" if self.default is False else argparse.BooleanOptionalAction
            )
        else:
            metavar = self.metavar or {int: "N", float: "NUM"}.get(self.item)
            kwargs.update(type=self._flag_value, choices=self.choices, metavar=metavar)
            if self.is_list or self.repeatable:
                kwargs["action"] = "append"
        parser.add_argument(self.flag, **kwargs)


def options_of(cls: type) -> dict[str, Option]:
    """The Option of each init field of dataclass `cls` (and its dataclass bases), in field
    order, except those marked `toml_only` in their metadata (tables a flag cannot hold);
    help is the field's metadata "help", else its attribute docstring."""
    hints = typing.get_type_hints(cls, include_extras=True)
    docs = attribute_docs(cls)
    out = {}
    for f in fields(cls):
        if not f.init or f.metadata.get("toml_only"):
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        default = None if default is MISSING else default
        text = f.metadata.get("help") or docs.get(f.name, "")
        out[f.name] = Option(
            f.name,
            hints[f.name],
            default,
            text,
            f.metadata.get("metavar"),
            bool(f.metadata.get("repeatable")),
        )
    return out


def read_env(options: Iterable[Option], env: typing.Mapping[str, str]) -> dict[str, Any]:
    """Each option set in `env` (as APPLIANCE_<NAME>, not empty), converted to its type."""
    return {o.name: o.parse(env[o.env], o.env) for o in options if env.get(o.env)}


def optional_settings(config: type, name: str) -> type:
    """A dataclass with every init field of dataclass `config`, each `T | None` with default
    None (= not pinned: the planner or `config`'s default decides) and its docstring as help.
    A str field listed in `config.CHOICES` becomes a Literal of those values."""
    hints = typing.get_type_hints(config)
    docs = attribute_docs(config)
    choices = getattr(config, "CHOICES", {})
    specs = []
    for f in fields(config):
        if f.init:
            hint = Literal[tuple(choices[f.name])] if f.name in choices else _unwrap(hints[f.name])
            help_text = docs.get(f.name, "")
            specs.append((f.name, hint | None, field(default=None, metadata={"help": help_text})))
    doc = f"Every {config.__name__} setting, optional (None = not pinned)."
    return make_dataclass(name, specs, namespace={"__module__": __name__, "__doc__": doc})


def attribute_docs(cls: type) -> dict[str, str]:
    """The docstring under each annotated attribute in the bodies of `cls` and its bases (a
    subclass's wins), each on one line; a class whose source cannot be read (made at run time)
    adds none."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _unwrap(hint: Any) -> Any:
    """`hint` without its Annotated extras and without None (`int | None` -> int)."""
    if typing.get_origin(hint) is typing.Annotated:
        hint = typing.get_args(hint)[0]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        rest = tuple(t for t in typing.get_args(hint) if t is not type(None))
        return _unwrap(rest[0]) if len(rest) == 1 else typing.Union[rest]  # noqa: UP007
    return hint
