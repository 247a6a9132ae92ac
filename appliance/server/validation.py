"""Validation of request bodies through the schema models, and pydantic's errors as our 400
envelope: the message names the parameter by its JSON path and says what it allows."""

from __future__ import annotations

import types
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from appliance.server.errors import APIError, bad_request
from appliance.server.schema.base import Allowed
from engine.text.surrogates import json_path

M = TypeVar("M", bound=BaseModel)
_KINDS = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "string_type": "a string",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}
_RANGE = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def validate(model: type[M], data: dict) -> M:
    """The body as `model`; APIError(400) naming the first problem when it does not fit."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise explain(model, exc.errors(include_url=False)) from None


def explain(model: type[BaseModel], errors: list[ErrorDetails]) -> APIError:
    """One 400 for a failed validation: an unknown field first, else the first error."""
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        loc = unknown[0]["loc"]
        name = json_path(loc)
        return bad_request(f"Unrecognized request argument supplied: {name}", param=name)
    error = errors[0]
    loc, annotation, metadata = _resolve(model, error["loc"])
    name = json_path(loc)
    shown = f"'{name}'" if len(loc) == 1 else name or "the request body"
    return bad_request(f"{shown} {_problem(error, annotation, metadata)}", param=name or None)


def _problem(error: ErrorDetails, annotation: Any, metadata: list) -> str:
    kind, value = error["type"], error["input"]
    if kind == "string_too_short" and value == "":
        return "must not be empty"
    if kind == "unsupported":
        return "is not supported by this server"
    allowed = next((m.what for m in metadata if isinstance(m, Allowed)), None)
    if allowed is not None:
        return f"must be {allowed}"
    if kind == "float_type" and isinstance(value, int) and not isinstance(value, bool):
        kind = "finite_number"  # an integer too large for a float
    if kind == "finite_number":
        return "must be a finite number"
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}, got {_json_type(value)}"
    if kind in _RANGE:
        return f"must be {_range(metadata)}, got {value}"
    if kind == "literal_error":
        return "must be one of " + ", ".join(str(a) for a in get_args(annotation))
    if kind == "missing":
        return "is required"
    ctx = error.get("ctx") or {}
    if kind == "too_short":
        n = ctx.get("min_length", 1)
        return "must not be empty" if n == 1 else f"must hold at least {n} items"
    if kind == "too_long":
        return f"may hold at most {ctx.get('max_length')} items"
    return error["msg"]


def _resolve(model: type[BaseModel], loc: tuple) -> tuple[tuple, Any, list]:
    """Follow `loc` through the model's fields, list items and dict values as far as it names
    them (it stops at a union's branch tag): (that prefix, the type there, its constraints and
    markers)."""
    annotation, metadata = model, []
    depth = 0
    for part in loc:
        fields = getattr(annotation, "model_fields", None)
        if isinstance(part, str) and isinstance(fields, dict) and part in fields:
            info = fields[part]
            annotation, more = _unwrap(info.annotation)
            metadata = list(info.metadata) + more
        elif isinstance(part, int) and get_origin(annotation) is list:
            annotation, metadata = _unwrap(get_args(annotation)[0])
        elif isinstance(part, str) and get_origin(annotation) is dict:
            annotation, metadata = _unwrap(get_args(annotation)[1])
        else:
            break
        depth += 1
    return loc[:depth], annotation, metadata


def _unwrap(annotation: Any) -> tuple[Any, list]:
    """The type under Annotated[...] and `| None`, with the Annotated metadata met on the way."""
    metadata: list = []
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation, *more = get_args(annotation)
            for m in more:  # Field(ge=0) inside Annotated carries its constraints as metadata
                metadata += m.metadata if isinstance(m, FieldInfo) else [m]
        elif origin in (Union, types.UnionType):
            branches = [a for a in get_args(annotation) if a is not type(None)]
            if len(branches) != 1:
                return annotation, metadata
            annotation = branches[0]
        else:
            return annotation, metadata


def _range(metadata: list) -> str:
    lo = hi = None
    lo_open = False
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_open = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
    if hi is None:
        return f"{'>' if lo_open else '>='} {lo}"
    if lo is None:
        return f"<= {hi}"
    return f"in {'(' if lo_open else '['}{lo}, {hi}]"


def _json_type(value: Any) -> str:
    """How a JSON value's type reads in a message: "a string", "an array", "null"..."""
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )
