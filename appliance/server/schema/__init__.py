"""The HTTP API's bodies as pydantic models: base (strict parsing, markers), requests (validated
on every request) and responses (what the server sends). /openapi.json is generated from them."""
