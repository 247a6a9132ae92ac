"""Structured outputs in the front end: the constraint a request ends up with (its
response_format or extra, a forced tool call's grammar, where reasoning comes first), and the
compile check that turns a grammar the library cannot take into a 400 before the engine sees it.

The check runs on a worker thread under a time limit, so a slow schema never blocks the event
loop; the engine core compiles again beside its step loop (a cache hit for a repeated schema).
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from appliance.server.errors import bad_request
from appliance.server.tools import PARSERS
from engine.structured import GrammarError, StructuredOutput
from engine.structured.llguidance_backend import LLGuidanceBackend

REASONING_OPEN, REASONING_CLOSE = "<think>", "</think>"
DEFAULT_TOOL_FORMAT = "hermes"
"""The call markup a forced call is written in when the model's own format is unknown."""
PARAMS = {
    "json_schema": "response_format.json_schema.schema",
    "json_object": "response_format",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}


class GrammarCheck:
    """Compiles each request's grammar once in the front end, off the event loop."""

    def __init__(self, info, timeout_s: float) -> None:
        self.info = info
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="grammar-check")
        self._backend: LLGuidanceBackend | None = None
        self._lock = threading.Lock()
        self._executor.submit(self.backend)  # read the tokenizer before the first request

    def backend(self) -> LLGuidanceBackend:
        with self._lock:
            if self._backend is None:
                info = self.info
                if info.tokenizer is None:
                    raise GrammarError("structured outputs need the model's tokenizer")
                self._backend = LLGuidanceBackend(
                    info.tokenizer, info.logits_size or info.vocab_size, info.eos_token_ids
                )
            return self._backend

    async def ready(self, param: str) -> None:
        """A 400 naming `param` when this model's tokenizer cannot take grammars."""
        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.backend)
        except GrammarError as exc:
            raise bad_request(f"cannot constrain the output: {exc}", param=param) from None

    def _compile(self, spec: StructuredOutput) -> float:
        start = time.perf_counter()
        self.backend().compile(spec)
        return time.perf_counter() - start

    async def check(self, spec: StructuredOutput, param: str, subject: str | None = None) -> float:
        """Seconds the compile took; a 400 naming `param` when the grammar is unusable or
        takes longer than the limit (the server keeps serving either way)."""
        loop = asyncio.get_running_loop()
        job = loop.run_in_executor(self._executor, self._compile, spec)
        try:
            return await asyncio.wait_for(job, self.timeout_s)
        except TimeoutError:
            raise bad_request(
                f"the {spec.kind} took longer than {self.timeout_s:g} s to compile: simplify "
                "it (fewer alternatives, smaller bounds)",
                param=param,
            ) from None
        except GrammarError as exc:
            subject = subject or f"this {_what(spec)}"
            raise bad_request(f"cannot follow {subject}: {exc}", param=param) from None

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _what(spec: StructuredOutput) -> str:
    return {"json_schema": "JSON schema", "json_object": "JSON object"}.get(spec.kind, spec.kind)


def forced_tools_spec(req, parser_name: str | None, literal) -> StructuredOutput | None:
    """The grammar of a chat request whose tool_choice forces a call, else None."""
    if req.tool_choice not in ("required", "function") or not req.tools:
        return None
    functions = [t["function"] for t in req.tools]
    parallel = req.parallel_tool_calls
    if req.tool_choice == "function":  # one call of the named function
        functions, parallel = [f for f in functions if f["name"] == req.tool_name], False
    parser = PARSERS[parser_name or DEFAULT_TOOL_FORMAT]()
    return StructuredOutput("grammar", parser.forced_grammar(functions, parallel, literal))


def after_reasoning(spec: StructuredOutput, starts_in_reasoning: bool) -> StructuredOutput:
    """A reasoning model's constraint starts once its reasoning ends: after "</think>" when the
    prompt opened it, else the output may begin with "<think>" and then waits for the end."""
    opener = None if starts_in_reasoning else REASONING_OPEN
    return replace(spec, start_after=REASONING_CLOSE, reasoning_open=opener)


def param_of(spec: StructuredOutput, forced_tool: bool) -> str:
    return "tool_choice" if forced_tool else PARAMS[spec.kind]


def special_literal(tokenizer):
    """Markup text -> Lark terminal for this tokenizer: each special token in the text becomes
    `<[id]>` (a special token is not matched by its spelling), the rest a quoted string."""
    import json

    specials = {}
    for token_id, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(added, "special", False) and added.content:
            specials[added.content] = token_id

    def literal(text: str) -> str:
        parts, rest = [], text
        while rest:
            hits = [(rest.find(s), s) for s in specials if s in rest]
            if not hits:
                parts.append(json.dumps(rest))
                break
            at, special = min(hits)
            if at:
                parts.append(json.dumps(rest[:at]))
            parts.append(f"<[{specials[special]}]>")
            rest = rest[at + len(special) :]
        return " ".join(parts)

    return literal
