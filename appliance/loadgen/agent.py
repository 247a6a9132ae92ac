"""A coding agent's conversation for the load generator (`appliance bench --agent`): every
request carries the agent's tools and its long system prompt; the first turn gives a task, and
each later turn answers the assistant's previous reply with a tool call's result, so the prompt
grows by one reply and one result a turn, as Codex's and Claude Code's do."""

from __future__ import annotations

import json

AGENT_TURNS = 20
"""Turns per conversation when --agent is given without --multi-turn."""
AGENT_SYSTEM_TOKENS = 4000
"""System prompt tokens when --agent is given without --prefix-len (the tools come on top)."""


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


AGENT_TOOLS = [
    _function(
        "shell",
        "Run a command in the workspace and return its output.",
        {
            "command": {"type": "array", "items": {"type": "string"}},
            "workdir": {"type": "string"},
            "timeout_ms": {"type": "integer", "minimum": 1},
        },
        ["command"],
    ),
    _function(
        "read_file",
        "Read a file of the workspace, optionally a range of its lines.",
        {
            "path": {"type": "string"},
            "offset": {"type": "integer", "minimum": 0},
            "limit": {"type": "integer", "minimum": 1},
        },
        ["path"],
    ),
    _function(
        "apply_patch",
        "Apply a unified diff to the workspace.",
        {"patch": {"type": "string"}},
        ["patch"],
    ),
    _function(
        "update_plan",
        "Record the plan and each step's status.",
        {
            "plan": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string"},
                        "status": {"enum": ["pending", "in_progress", "completed"]},
                    },
                    "required": ["step", "status"],
                },
            }
        },
        ["plan"],
    ),
]
"""The tools an agent's requests carry (a coding agent's usual four), in OpenAI's shape."""


def call_id(turn: int) -> str:
    return f"call_{turn}"


def tool_call(turn: int) -> dict:
    """The call the assistant's reply of `turn` is taken to make: the next turn answers it."""
    arguments = json.dumps({"path": f"src/module_{turn}.py", "offset": 0, "limit": 200})
    return {
        "id": call_id(turn),
        "type": "function",
        "function": {"name": "read_file", "arguments": arguments},
    }


def prompt_message(turn: int, text: str) -> dict:
    """Turn `turn`'s new message (turns count from 0): the task, then each call's result."""
    if turn == 0:
        return {"role": "user", "content": text}
    return {"role": "tool", "tool_call_id": call_id(turn - 1), "content": text}


def reply_message(turn: int, text: str) -> dict:
    """The assistant's reply of `turn` as the history keeps it: what it wrote, and its call."""
    return {"role": "assistant", "content": text, "tool_calls": [tool_call(turn)]}
