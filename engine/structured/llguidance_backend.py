"""The grammar library: llguidance (Rust, no dependencies). A schema compiles in about a
millisecond and a mask takes tens of microseconds (docs/performance.md, "Grammar libraries"),
so no compile cache is needed for speed; compiled grammars are still kept (an LRU of matchers
at their start state, copied per request) so a repeated schema skips even that."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

import llguidance
import torch

from engine.structured.backend import GrammarBackend, GrammarError, Matcher
from engine.structured.pool import GrammarPool
from engine.structured.structured_output import StructuredOutput
from engine.text.surrogates import find_in_value

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""JSON as json.dumps writes it: no free whitespace, so a weak model cannot pad an answer with
newlines until max_tokens."""
CACHE_SIZE = 256
FILL_THREADS = 1
"""llguidance's threads filling a step's rows: more fill no faster (fill's comment)."""


def grammar_text(spec: StructuredOutput) -> str:
    """The llguidance grammar for a spec (not yet checked against a tokenizer); GrammarError
    when it cannot be one."""
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, JSON_OPTIONS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.value)
        except ValueError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError("a JSON schema must be an object (or true/false)")
        _refuse_surrogates(schema, "schema")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, JSON_OPTIONS)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise GrammarError(str(exc)) from None
    if spec.kind == "regex":
        _refuse_surrogates(spec.value, "regex")
        return llguidance.LLMatcher.grammar_from_regex(spec.value)
    if spec.kind == "choice":
        options = json.loads(spec.value)
        if not options or not all(isinstance(o, str) and o for o in options):
            raise GrammarError("choice must be a non-empty list of non-empty strings")
        _refuse_surrogates(options, "choice")
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(o) for o in dict.fromkeys(options))
        )
    _refuse_surrogates(spec.value, "grammar")
    return llguidance.LLMatcher.grammar_from_lark(spec.value)


def _refuse_surrogates(value, name: str) -> None:
    """llguidance takes UTF-8: a lone surrogate would fail in its bindings (UnicodeEncodeError)
    or read as an odd escape, so it is refused here, by place."""
    found = find_in_value(value)
    if found is not None:
        raise GrammarError(found.describe(name))


class LLGuidanceMatcher(Matcher):
    __slots__ = ("inner",)

    def __init__(self, inner: llguidance.LLMatcher) -> None:
        self.inner = inner

    def accept(self, token_id: int) -> bool:
        return self.inner.consume_token(token_id)

    def rollback(self, num_tokens: int) -> None:
        self.inner.rollback(num_tokens)

    @property
    def is_terminated(self) -> bool:
        return self.inner.is_stopped()


class LLGuidanceBackend(GrammarBackend):
    name = "llguidance"

    def __init__(self, tokenizer, vocab_size: int, eos_token_ids) -> None:
        """tokenizer: a fast Hugging Face tokenizer (its tokenizer.json is what llguidance
        reads); vocab_size: the model's logits width (it may pad past the tokenizer's)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise GrammarError("structured outputs need a fast tokenizer (tokenizer.json)")
        self.vocab_size = vocab_size
        eos = sorted(eos_token_ids) or [tokenizer.eos_token_id]
        self.tokenizer = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab_size, eos_token=eos)
        self._executor = llguidance.LLExecutor(FILL_THREADS)
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: StructuredOutput) -> llguidance.LLMatcher:
        """A matcher at the grammar's start, cached by (kind, value); copy it per request."""
        key = (spec.kind, spec.value)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        text = grammar_text(spec)
        error = llguidance.LLMatcher.validate_grammar(text, self.tokenizer)
        if error:
            raise GrammarError(error)
        compiled = llguidance.LLMatcher(self.tokenizer, text)
        if compiled.is_error():
            raise GrammarError(compiled.get_error())
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def matcher(self, compiled: llguidance.LLMatcher) -> LLGuidanceMatcher:
        return LLGuidanceMatcher(compiled.deep_copy())

    def fill(self, rows: list[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        # One after another, in one call that releases the GIL (the engine's thread runs on
        # meanwhile): on the H200 test machine's host (16 cores) 64 rows on random valid paths
        # of benchmarks/structured_schemas.py's schema filled in 3.8, 3.9, 5.1 and 5.8 ms on 1,
        # 2, 4 and 8 of llguidance's threads, and in 4.2 ms in a Python loop.
        # The matcher writes each row in place (llguidance.torch's fill_next_token_bitmask does
        # the same; importing that module runs torch.compile's set-up, which the engine avoids).
        if bitmask.dtype != torch.int32 or not bitmask.is_cpu or not bitmask.is_contiguous():
            raise ValueError("the bitmask must be a contiguous int32 tensor on the CPU")
        row_bytes = bitmask.shape[1] * bitmask.element_size()
        if len(rows) == 1:
            m, row = rows[0]
            m.inner.unsafe_compute_mask_ptr(bitmask[row].data_ptr(), row_bytes)
            return
        self._executor.unsafe_compute_mask_ptr(
            [(m.inner, row) for m, row in rows], bitmask.data_ptr(), row_bytes, bitmask.shape[0]
        )


def llguidance_pool(
    tokenizer, vocab_size: int, eos_token_ids, max_rows: int, device
) -> GrammarPool:
    """The engine's grammar pool on llguidance (the backend reads the tokenizer on the pool)."""
    return GrammarPool(
        lambda: LLGuidanceBackend(tokenizer, vocab_size, eos_token_ids),
        max_rows,
        vocab_size,
        device,
    )
