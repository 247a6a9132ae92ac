"""Structured outputs: a request's grammar (JSON schema, regex, choice, grammar text) turned
into a token mask each step, so the output is valid whatever the weights would pick.

spec.py says what a request asks for (library-neutral); backend.py is the interface the engine
uses (compile, fill the bitmask, accept, rollback, terminated); llguidance_backend.py implements
it; state.py is one request's matcher and where its constrained part starts; bitmask.py applies
a batch's bitmask to the logits on the device.
"""

from engine.structured.backend import GrammarBackend, GrammarError, Matcher
from engine.structured.structured_output import KINDS, StructuredOutput

__all__ = ["KINDS", "GrammarBackend", "GrammarError", "Matcher", "StructuredOutput"]
