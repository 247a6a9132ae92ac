"""Test cases for structured outputs over the OpenAI API (tests/test_structured_openai.py): JSON
schemas with the request that should produce them, tools with their parameters, and the
request bodies that ask for them."""

from __future__ import annotations


def obj(**props) -> dict:
    """An object schema whose listed properties are all required and nothing else is allowed."""
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def int_range(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


SCHEMAS = [
    ("a colour", obj(color={"enum": ["red", "green", "blue"]})),
    ("a person", obj(person=obj(name={"type": "string", "maxLength": 20}, age=int_range(0, 120)))),
    (
        "two to four fruits",
        {
            "type": "array",
            "items": {"enum": ["apple", "pear", "fig"]},
            "minItems": 2,
            "maxItems": 4,
        },
    ),
    (
        "a small number or a short word",
        {"anyOf": [int_range(0, 10), {"type": "string", "maxLength": 5}]},
    ),
    ("an airport code", obj(code={"type": "string", "pattern": "^[A-Z]{3}$"})),
    ("a probability", obj(p={"type": "number", "minimum": 0, "maximum": 1})),
    ("two flags", obj(done={"type": "boolean"}, urgent={"type": "boolean"})),
    ("an event day", obj(kind={"const": "event"}, day=int_range(1, 31))),
    (
        "one or two cities",
        {
            "type": "array",
            "items": obj(
                city={"type": "string", "maxLength": 15},
                country={"type": "string", "maxLength": 15},
            ),
            "minItems": 1,
            "maxItems": 2,
        },
    ),
    ("a nickname or null", obj(nickname={"type": ["string", "null"], "maxLength": 10})),
    (
        "a score strictly between 0 and 10",
        obj(score={"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}),
    ),
    (
        "a point",
        {
            "$defs": {"coord": int_range(-50, 50)},
            **obj(x={"$ref": "#/$defs/coord"}, y={"$ref": "#/$defs/coord"}),
        },
    ),
    ("a level", {"allOf": [{"type": "integer"}, {"minimum": 1, "maximum": 5}]}),
    (
        "a grid of marks",
        {
            "type": "array",
            "items": {
                "type": "array",
                "items": {"enum": ["x", "o", "-"]},
                "minItems": 3,
                "maxItems": 3,
            },
            "minItems": 3,
            "maxItems": 3,
        },
    ),
    (
        "a book, maybe with a year",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 30},
                "year": int_range(1500, 2030),
            },
            "required": ["title"],
            "additionalProperties": False,
        },
    ),
    (
        "a username",
        obj(username={"type": "string", "minLength": 3, "maxLength": 8, "pattern": "^[a-z0-9_]+$"}),
    ),
    ("a date", obj(date={"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"})),
    (
        "a row of three values",
        {
            "type": "array",
            "prefixItems": [
                {"type": "string", "maxLength": 10},
                int_range(0, 9),
                {"type": "boolean"},
            ],
            "items": False,
            "minItems": 3,
        },
    ),
    ("one of these values", obj(value={"enum": [1, "two", None, True]})),
    ("a temperature in celsius", obj(celsius={"type": "number", "minimum": -40, "maximum": 50})),
    (
        "three small numbers",
        {"type": "array", "items": int_range(0, 99), "minItems": 3, "maxItems": 3},
    ),
    (
        "an address",
        obj(
            address=obj(
                street={"type": "string", "maxLength": 25},
                geo=obj(lat=int_range(-90, 90), lon=int_range(-180, 180)),
            )
        ),
    ),
    (
        "a shape",
        {
            "anyOf": [
                obj(kind={"const": "circle"}, r=int_range(1, 9)),
                obj(kind={"const": "square"}, side=int_range(1, 9)),
            ]
        },
    ),
    (
        "a price",
        obj(
            price={"type": "number", "minimum": 0, "maximum": 1000, "multipleOf": 0.01},
            currency={"enum": ["EUR", "USD"]},
        ),
    ),
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": obj(
                city={"type": "string", "maxLength": 20}, unit={"enum": ["celsius", "fahrenheit"]}
            ),
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two whole numbers.",
            "parameters": obj(a=int_range(0, 100), b=int_range(0, 100)),
        },
    },
]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK_TOOLS = [{"role": "user", "content": "What is the weather in Paris? And what is 2 + 3?"}]


def ask(what: str) -> list[dict]:
    return [{"role": "user", "content": f"Reply with JSON: {what}."}]


def schema_format(schema: dict, name: str = "answer") -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
