"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}): an adapter
over the chat route's generation path, with its own output items, stream events and store."""

from __future__ import annotations

from appliance.server.responses_api.routes import RESPONSE_STORE, routes, setup

__all__ = ["RESPONSE_STORE", "routes", "setup"]
