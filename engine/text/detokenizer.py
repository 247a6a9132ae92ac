"""Incremental detokenization: token ids in, text deltas out, with stop strings.

Decoding the whole output every step costs O(length) per token, so each step decodes only a
short window of recent ids (the prefix/read offset technique): `prefix_text` is the window's
already-accounted tokens, and whatever the full window decodes to beyond it is new text. The
few context tokens in front keep decoder rules that treat the first token specially (a
SentencePiece leading space, byte-fallback pieces) from leaking into the new text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

REPLACEMENT_CHAR = "\ufffd"  # what an incomplete UTF-8 sequence decodes to
NUM_CONTEXT_TOKENS = 4  # tokens decoded in front of the new ones, for context
MAX_CONTEXT_TOKENS = 16  # how far back to look for a clean window start
FORCE_BPE_CLEAN_UP = "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output"
"""transformers' tokenizer attribute that makes decode clean up spaces for a BPE model too."""


def raw_decoder(tokenizer) -> Callable[[list[int], bool], str]:
    """decode(ids, skip_special_tokens) with what `tokenizer.decode` returns, for the two
    decodes per token per request of every step: the Rust tokenizer's own decode where
    transformers' wrapper would change nothing (a fast tokenizer that cleans up no spaces; it
    never cleans them for a BPE model unless forced), which skips the wrapper's per-call
    conversions (6-7x the Rust call's time for a short window); else `tokenizer.decode`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    cleans_up = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False)) and not (
        backend is not None
        and type(backend.model).__name__ == "BPE"
        and not getattr(tokenizer, FORCE_BPE_CLEAN_UP, False)
    )
    if backend is None or cleans_up:
        return lambda ids, skip: tokenizer.decode(ids, skip_special_tokens=skip)
    return lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text, a delta at a time.

    Contract:
      - With no stop string matched, the concatenation of every `step()` delta and `finish()`
        equals `tokenizer.decode(generated_ids, skip_special_tokens=skip_special_tokens)`.
      - A delta never ends inside a multi-byte character: text whose tail still decodes to
        U+FFFD is held back until the bytes that complete it arrive (or `finish()`).
      - When a stop string appears in the text (it may span several tokens), the text is cut
        right before it, `stopped_on` names it, and nothing more is ever released. Until then
        at most len(longest stop) - 1 characters, those that could begin a stop string, are
        held back.

    `prompt_token_ids` is recorded but not used as decoding context: the output is decoded as
    it starts, so its text is exactly what decoding the output ids alone gives (no leading
    space a SentencePiece tokenizer would add after a prompt).
    """

    def __init__(
        self,
        tokenizer,
        prompt_token_ids: Sequence[int],
        skip_special_tokens: bool = True,
        stop: Sequence[str] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self._raw_decode = raw_decoder(tokenizer)
        self.prompt_token_ids = list(prompt_token_ids)
        self.skip_special_tokens = skip_special_tokens
        self.stop = [s for s in stop if s]
        self.token_ids: list[int] = []
        """Generated ids seen so far."""
        self.text = ""
        """All text released so far."""
        self.stopped_on: str | None = None
        """The stop string that ended the text, or None."""
        self._max_stop_len = max((len(s) for s in self.stop), default=0)
        self._prefix_offset = 0  # window start: tokens before it are never decoded again
        self._read_offset = 0  # ids before it are fully turned into text
        self._prefix_text = ""  # decode(token_ids[prefix_offset:read_offset])
        self._num_window_chars = 0  # chars of the unread tokens' text already taken
        self._pending = ""  # decoded text not yet released (a possible stop string start)

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Add newly generated ids; return the text they release (possibly empty)."""
        if self.stopped_on is not None:
            return ""
        self.token_ids.extend(new_token_ids)
        if not new_token_ids:
            return ""
        self._pending += self._read_new_text(final=False)
        return self._release(final=False)

    def step_each(self, new_token_ids: Sequence[int]) -> str:
        """`step` one id at a time, stopping at the id that completes a stop string (the ids
        after it are not taken: a speculative step emits several at once)."""
        text = []
        for token in new_token_ids:
            if self.stopped_on is not None:
                break
            text.append(self.step([token]))
        return "".join(text)

    def finish(self) -> str:
        """End of generation: release everything still held back (unless a stop string hit)."""
        if self.stopped_on is not None:
            return ""
        self._pending += self._read_new_text(final=True)
        return self._release(final=True)

    def _decode(self, ids: list[int]) -> str:
        return self._raw_decode(ids, self.skip_special_tokens)

    def _read_new_text(self, final: bool) -> str:
        """Text the ids after `read_offset` add, minus what was already taken from them."""
        ids = self.token_ids
        window_text = self._decode(ids[self._prefix_offset :])
        # [new chars]: the unread tokens' text, as decoded after the context tokens
        unread_text = window_text[len(self._prefix_text) :]
        if final or (unread_text and not unread_text.endswith(REPLACEMENT_CHAR)):
            fresh = unread_text[self._num_window_chars :]
            self._advance(len(ids))
            return fresh
        # The tail is an incomplete character: take the complete text before it, keep the window.
        complete = unread_text.rstrip(REPLACEMENT_CHAR)
        fresh = complete[self._num_window_chars :]
        self._num_window_chars = max(self._num_window_chars, len(complete))
        return fresh

    def _advance(self, read_offset: int) -> None:
        """Everything before `read_offset` is now text; keep a few tokens of context before it."""
        self._prefix_offset, self._prefix_text = self._choose_window_start(read_offset)
        self._read_offset = read_offset
        self._num_window_chars = 0

    def _choose_window_start(self, read_offset: int) -> tuple[int, str]:
        """(start, decoded context) for the next window: a few tokens back, on a character.

        A window starting inside a multi-byte character decodes it as U+FFFD (and byte-fallback
        decoders turn a whole run of <0xNN> pieces into U+FFFD if any of it is incomplete), and
        context that decodes to nothing (skipped special tokens) lets a SentencePiece decoder
        strip the next word's leading space: try later starts, then earlier ones, to avoid both.
        """
        start = max(0, read_offset - NUM_CONTEXT_TOKENS)
        earliest = max(0, read_offset - MAX_CONTEXT_TOKENS)
        for offset in chain(range(start, read_offset), range(start - 1, earliest - 1, -1)):
            text = self._decode(self.token_ids[offset:read_offset])
            if text and not text.startswith(REPLACEMENT_CHAR):
                return offset, text
        return start, self._decode(self.token_ids[start:read_offset])

    def _release(self, final: bool) -> str:
        """Move pending text to `text`, stopping at a stop string, holding a possible start."""
        pending = self._pending
        if self.stop:
            cut, hit = _find_first_stop(pending, self.stop)
            if hit is not None:
                self.stopped_on = hit
                self._pending = ""
                return self._emit(pending[:cut])
        num_held = 0 if final else _partial_stop_len(pending, self.stop, self._max_stop_len)
        delta = pending[: len(pending) - num_held]
        self._pending = pending[len(delta) :]
        return self._emit(delta)

    def _emit(self, delta: str) -> str:
        self.text += delta
        return delta


def _find_first_stop(text: str, stop: list[str]) -> tuple[int, str | None]:
    """(index, stop string) of the earliest stop string in `text`; (-1, None) if none."""
    best, hit = -1, None
    for s in stop:
        i = text.find(s)
        if i != -1 and (best == -1 or i < best):
            best, hit = i, s
    return best, hit


def _partial_stop_len(text: str, stop: list[str], max_stop_len: int) -> int:
    """Length of the longest tail of `text` that is a proper prefix of some stop string."""
    for n in range(min(len(text), max_stop_len - 1), 0, -1):
        tail = text[-n:]
        if any(len(s) > n and s.startswith(tail) for s in stop):
            return n
    return 0
