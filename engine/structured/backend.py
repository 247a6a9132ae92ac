"""The interface between the engine and a grammar library: everything the step loop asks of a
request's grammar. A second library plugs in by implementing these two classes."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from engine.structured.structured_output import StructuredOutput


class GrammarError(ValueError):
    """The grammar cannot be used; the message names the keyword or the reason."""


class Matcher(ABC):
    """One request's grammar state: which tokens may come next."""

    @abstractmethod
    def accept(self, token_id: int) -> bool:
        """Advance over a sampled token; False when the grammar does not allow it."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens."""

    @property
    @abstractmethod
    def is_terminated(self) -> bool:
        """The grammar is complete: no token may follow but end-of-sequence."""


class GrammarBackend(ABC):
    """A grammar library bound to one tokenizer and vocabulary size."""

    name: str

    @abstractmethod
    def compile(self, spec: StructuredOutput) -> object:
        """The library's compiled grammar for `spec`; raises GrammarError saying why not."""

    @abstractmethod
    def matcher(self, compiled: object) -> Matcher:
        """A fresh matcher at the start of the grammar."""

    @abstractmethod
    def fill(self, rows: list[tuple[Matcher, int]], bitmask: torch.Tensor) -> None:
        """Write each matcher's allowed next tokens into its row of `bitmask` (int32
        [rows, ceil(vocab / 32)], bit t % 32 of word t // 32 set = token t allowed). It may run
        on a thread beside the engine's: release the GIL for the rows where the library can."""
