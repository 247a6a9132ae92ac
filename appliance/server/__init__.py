"""The HTTP server: an aiohttp app exposing the engine through an OpenAI-compatible API."""

from appliance.server.app import create_app

__all__ = ["create_app"]
