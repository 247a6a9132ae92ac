"""The one real `appliance serve` on the embedded model that the client end-to-end modules share
(the anthropic client; the openai client's Responses API and structured outputs; `appliance
bench`): started by the first test that asks for it (`shared_server`, tests/conftest.py) and
stopped at the end of the session, instead of one server per module at 8-10 s of start-up each.

Its flags are the union of what those modules need: room for 1024-token prompts, the `claude-*`
alias Claude Code sends, and an API key per module (so everywhere a request without a valid key
is refused). Their tests run one after another and no test counts on a cold prefix cache except
for prompts only it sends. A module whose tests depend on a flag of their own (a smaller pool, a
request log, a drain timeout) keeps a server of its own."""

from __future__ import annotations

from dataclasses import dataclass

SERVED = "SmolLM2-135M-Instruct"
"""The embedded model's name, as the server reports it."""
KEYS = {
    "claude": "sk-claude-test-1",
    "alice": "sk-alice-0123456789",
    "bob": "sk-bob-0123456789",
    "structured": "sk-structured-0123456789",
    "bench": "sk-bench-0123456789",
}
"""API keys by user name."""
FLAGS = (
    "--max-model-len", "1024", "--num-kv-blocks", "256", "--log-level", "warning",
    "--model-alias", f"claude-*={SERVED}",
    *(f for user, key in KEYS.items() for f in ("--api-key", f"{user}:{key}")),
)  # fmt: skip


@dataclass(frozen=True)
class SharedServer:
    url: str
    """Base URL, without /v1."""
    keys: dict[str, str]
    """API keys by user name (KEYS)."""
