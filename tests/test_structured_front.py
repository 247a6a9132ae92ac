"""The front end's side of structured outputs: where a reasoning model's constraint starts,
special-token markup in forced-call grammars, and which calls a forced tool_choice allows."""

from __future__ import annotations

import json

import llguidance

from appliance.server.protocol import GenerateRequest
from appliance.server.request_grammar import after_reasoning, forced_tools_spec, special_literal
from appliance.server.tools import PARSERS
from engine.structured import StructuredOutput
from tests.support.tiny_models import byte_tokenizer

TOOLS = [
    {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "g"}},
]


def test_the_constraint_starts_after_reasoning():
    spec = StructuredOutput("regex", "[0-9]+")
    opened = after_reasoning(spec, starts_in_reasoning=True)
    assert (opened.start_after, opened.reasoning_open) == ("</think>", None)
    free = after_reasoning(spec, starts_in_reasoning=False)
    assert (free.start_after, free.reasoning_open) == ("</think>", "<think>")
    assert (free.kind, free.value) == (spec.kind, spec.value)


def test_special_tokens_in_markup_are_token_ids():
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["[TOOL_CALLS]"]})
    marker = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    literal = special_literal(tok)
    assert literal("[TOOL_CALLS]") == f"<[{marker}]>"
    assert literal("a[TOOL_CALLS]b") == f'"a" <[{marker}]> "b"'
    assert literal("<tool_call>\n") == json.dumps("<tool_call>\n")
    grammar = PARSERS["mistral"]().forced_grammar([TOOLS[0]["function"]], False, literal)
    ll_tok = llguidance.LLTokenizer(
        tok.backend_tokenizer.to_str(), n_vocab=len(tok), eos_token=tok.eos_token_id
    )
    matcher = llguidance.LLMatcher(ll_tok, llguidance.LLMatcher.grammar_from_lark(grammar))
    ids = [marker] + tok.encode('[{"name": "f", "arguments": {}}]', add_special_tokens=False)
    assert all(matcher.consume_token(t) for t in ids), matcher.get_error()
    assert matcher.is_stopped()
    spelled = llguidance.LLMatcher(ll_tok, llguidance.LLMatcher.grammar_from_lark(grammar))
    text_ids = tok.encode("[TOOL_CALLS]", add_special_tokens=False, split_special_tokens=True)
    assert not spelled.consume_token(text_ids[0])  # the spelling is not the token


def _req(choice: str, name: str | None = None, parallel: bool = True) -> GenerateRequest:
    return GenerateRequest(
        "chat", None, tools=TOOLS, tool_choice=choice, tool_name=name, parallel_tool_calls=parallel
    )


def test_which_calls_a_forced_tool_choice_allows():
    assert forced_tools_spec(_req("auto"), "hermes", json.dumps) is None
    named = forced_tools_spec(_req("function", "g"), "hermes", json.dumps).value
    assert '"const": "g"' in named and '"const": "f"' not in named and ")*" not in named
    required = forced_tools_spec(_req("required"), "hermes", json.dumps).value
    assert '"const": "f"' in required and '"const": "g"' in required and ")*" in required
    single = forced_tools_spec(_req("required", parallel=False), "hermes", json.dumps).value
    assert ")*" not in single
    fallback = forced_tools_spec(_req("required"), None, json.dumps).value
    assert "<tool_call>" in fallback  # a model with no known markup writes the hermes form
