"""Anthropic's Messages API (what Claude Code and the Claude Agent SDK speak), an adapter over
the generation path the OpenAI routes use."""

from appliance.server.anthropic_api.routes import anthropic_envelope, routes

__all__ = ["anthropic_envelope", "routes"]
