"""N-gram (prompt-lookup) drafting: propose the tokens that followed the most recent earlier
occurrence of a request's last n tokens, n from max_n down to min_n.

Each request keeps an index per n: n-gram -> the position right after its most recent
occurrence that has a continuation. Appending a token adds one entry per n, and a proposal is
one dictionary lookup per n, so a step costs the same at 100 tokens as at 100k (no scan of the
sequence). `python -m benchmarks.bench_ngram_drafter` on the 2-core development CPU (shared, load
average 4), 8,192 tokens: one appended token plus one propose(k=8) takes 4 us a call, against
150-230 us for a backward scan of the sequence; the first call, which indexes the whole
sequence, 10 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.spec.drafter import Draft, Drafter, DraftInput, per_request_k

DEFAULT_MAX_N = 4
"""Longest suffix matched."""
DEFAULT_MIN_N = 2
"""Shortest suffix matched (1 would propose after any repeated single token: mostly noise)."""


class NgramIndex:
    """The n-gram index of one token sequence, grown by `extend`.

    An n-gram's key is its tokens packed into one int, 32 bits each (last token lowest): exact,
    and unlike a tuple it is no object for the garbage collector to track (with torch loaded,
    indexing 8k tokens as tuples took 120-150 ms instead of 10 ms, in the collections it set
    off).
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.after: dict[int, dict[int, int]] = {n: {} for n in range(min_n, max_n + 1)}
        """after[n][key] = the index right after the n-gram's latest occurrence that has a
        continuation."""

    def extend(self, new_tokens: Sequence[int]) -> None:
        tokens, after, min_n = self.tokens, self.after, self.min_n
        for token in new_tokens:
            if not 0 <= token < 1 << 32:
                raise ValueError(f"token ids must be in [0, 2**32), got {token}")
            end = len(tokens)  # the n-grams ending here now have `token` as a continuation
            key = 0
            for n in range(1, min(self.max_n, end) + 1):
                key |= tokens[end - n] << (32 * (n - 1))
                if n >= min_n:
                    after[n][key] = end
            tokens.append(token)

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching
        suffix; [] when no suffix of length >= min_n occurred before."""
        tokens = self.tokens
        length = len(tokens)
        keys = []  # keys[n - 1]: the last n tokens
        key = 0
        for n in range(1, min(self.max_n, length - 1) + 1):  # a match needs an earlier start
            key |= tokens[length - n] << (32 * (n - 1))
            keys.append(key)
        for n in range(len(keys), self.min_n - 1, -1):
            start = self.after[n].get(keys[n - 1])
            if start is not None:
                return tokens[start : start + k]
        return []


class NgramDrafter(Drafter):
    """Prompt-lookup drafting over each request's prompt and output so far (q is one-hot)."""

    name = "ngram"

    def __init__(self, min_n: int = DEFAULT_MIN_N, max_n: int = DEFAULT_MAX_N) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got {min_n} and {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._indexes: dict[str, NgramIndex] = {}

    def propose(self, requests: Sequence[DraftInput], k: int | Sequence[int]) -> list[Draft]:
        ks = per_request_k(requests, k)
        drafts = []
        for req, num in zip(requests, ks):
            if num == 0:
                drafts.append(Draft([]))
                continue
            drafts.append(Draft(self._synced(req).lookup(num)))
        return drafts

    def release(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)

    def _synced(self, req: DraftInput) -> NgramIndex:
        """The request's index, extended by the tokens read back since the last call; rebuilt
        when the sequence is shorter than what was indexed or differs at its last indexed
        token (the engine only appends, so a full comparison would be wasted work)."""
        known = len(req.token_ids) - req.num_pending  # placeholders are not tokens yet
        index = self._indexes.get(req.request_id)
        if index is not None:
            have = len(index.tokens)
            if have > known or (have and req.token_ids[have - 1] != index.tokens[-1]):
                index = None
        if index is None:
            index = self._indexes[req.request_id] = NgramIndex(self.min_n, self.max_n)
        index.extend(req.token_ids[len(index.tokens) : known])
        return index
