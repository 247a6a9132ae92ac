"""What every body model shares: strict request parsing where null means the default, and the
two markers the error messages and /openapi.json read (Allowed, unsupported)."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError


class Allowed:
    """Field metadata: what the field accepts, in words. A validation error anywhere inside the
    field (a union branch, a list item) is reported as "<field> must be <what>"."""

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what


def unsupported(kind: Any, *accepted: object) -> Any:
    """The type of a field this server does not serve: null and the `accepted` values pass (they
    ask for nothing), anything else is a 400 "<field> is not supported by this server"."""

    def check(value: Any) -> Any:
        if value is None or value in accepted:
            return value
        raise PydanticCustomError("unsupported", "is not supported by this server")

    shown = " or ".join(json.dumps(a) for a in accepted)
    note = f"Not supported by this server: only {shown} (or null) is accepted."
    return Annotated[kind, AfterValidator(check), Field(description=note)]


class RequestModel(BaseModel):
    """A request body: JSON types are strict ("1" is not 1, true is not 1), unknown fields are
    refused, NaN and infinities are refused, and null for a field means its default, as in
    OpenAI's API."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_is_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}
        return data


class Part(BaseModel):
    """An object nested in a request (a message, a content part, stream options): strict types,
    and keys this server does not read are ignored, as OpenAI's clients may send more."""

    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class ResponseModel(BaseModel):
    """A response body, as the server sends it: exactly these keys."""

    model_config = ConfigDict(extra="forbid")
