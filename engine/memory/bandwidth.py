"""BandwidthMeter: the memory bandwidth decode achieves, as a share of the device's peak.

A decode step reads every weight once plus the KV cache of every sequence's context (the
performance model of docs/design.md): bytes = weight bytes + sum(context tokens) x KV bytes per
token, both from the plan (engine.planner's weight_bytes and kv_bytes_per_token, which count
all layers). A mixture-of-experts model reads only the experts its batch routes to: at most
min(num_experts, sequences x num_experts_per_tok) per layer (Plan.decode_weight_bytes). A
hybrid model's linear layers read and write each sequence's state once a step: 2 x state bytes
per sequence (Plan.decode_bytes). Like
the project's decode floor, the other weights count in full, an untied input embedding
included (a step gathers only its sequences' rows of that table), so the share is
floor time / step time. Steps that carry prefill tokens read the same bytes but are bound by
compute: they are left out of the figure and only counted ("mixed_steps"), and so is the
decode step right after one: its time would hold the end of that step's prefill, whose end the
host does not see where the step samples nothing (a prompt chunk is not waited for).

A step's time is the wall time from its end back to the later of its own start (scheduling
included) and the previous step's end. Without overlap that is the whole step. With overlapped
steps on the GPU the next step is queued before the previous one ends, so it is the time
between two steps' ends: the device's time per step while the device is never idle, and also
any time it waits for the host (which lowers the share, as it lowers throughput).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 5.0
"""The figure averages the decode steps that ended in the last WINDOW_S seconds."""


class BandwidthMeter:
    """Fed by the step loop: `launched` when a step is scheduled, `completed` when its tokens
    are read back (steps end in the order they start); `report` for engine stats()."""

    def __init__(
        self,
        weight_bytes: int,
        kv_bytes_per_token: int,
        peak_gbs: float | None,
        peak_source: str | None,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.perf_counter,
        step_weight_bytes: Callable[[int], int] | None = None,
        state_bytes_per_sequence: int = 0,
    ) -> None:
        """step_weight_bytes(num_seqs): the weight bytes a decode step of num_seqs sequences
        reads (fewer than weight_bytes where experts go unrouted); None: weight_bytes.
        state_bytes_per_sequence: each sequence's linear-attention state (0: none)."""
        if weight_bytes <= 0 or kv_bytes_per_token <= 0:
            raise ValueError("weight_bytes and kv_bytes_per_token must be positive")
        self.weight_bytes, self.kv_bytes_per_token = weight_bytes, kv_bytes_per_token
        self.step_weight_bytes = step_weight_bytes
        self.state_bytes_per_sequence = state_bytes_per_sequence
        self.peak_gbs = peak_gbs if peak_gbs else None
        self.peak_source = peak_source if self.peak_gbs else None
        self.window_s, self.clock = window_s, clock
        self.reset()

    @classmethod
    def for_plan(cls, plan) -> BandwidthMeter:
        """The meter of an engine built on `plan` (engine.planner's Plan): its weight and KV
        bytes, its peak bandwidth, with experts the bytes a step of n sequences reads, and
        with linear layers the state bytes per sequence."""
        return cls(
            plan.weight_bytes,
            plan.kv_bytes_per_token,
            plan.bandwidth_gbs,
            plan.bandwidth_source,
            step_weight_bytes=plan.decode_weight_bytes if plan.expert_bytes else None,
            state_bytes_per_sequence=plan.state_bytes_per_sequence,
        )

    def reset(self) -> None:
        """Forget every step (the engine's counters reset after warm-up)."""
        self._launched: dict[int, tuple[float, int | None]] = {}
        self._last_end: float | None = None
        self._last_mixed = False
        self._decodes: deque[tuple[float, int, float]] = deque()
        """(end, bytes read, seconds) of each decode step in the window."""
        self._mixed: deque[float] = deque()
        """End of each step with prefill tokens, or right after one, in the window."""
        self._bytes = 0
        self._seconds = 0.0

    def read_bytes(self, context_lens: list[int]) -> int:
        """Bytes one decode step reads: every weight once (with experts, the ones the batch can
        route to), plus each sequence's context (the tokens its attention reads, the new one
        included) x KV bytes per token, plus each sequence's state read and written back
        (the same sum as Plan.decode_bytes)."""
        weights = self.weight_bytes
        if self.step_weight_bytes is not None:
            weights = self.step_weight_bytes(len(context_lens))
        state = 2 * len(context_lens) * self.state_bytes_per_sequence
        return weights + sum(context_lens) * self.kv_bytes_per_token + state

    def launched(self, key: object, start: float, context_lens: list[int] | None) -> None:
        """A step began at `start` (the clock's time); context_lens: each sequence's context
        in a decode-only step, None for a step with prefill tokens."""
        nbytes = None if context_lens is None else self.read_bytes(context_lens)
        self._launched[id(key)] = (start, nbytes)

    def completed(self, key: object) -> None:
        """The step launched with `key` has ended (its tokens are on the host)."""
        entry = self._launched.pop(id(key), None)
        if entry is None:
            return
        start, nbytes = entry
        end = self.clock()
        begin = start if self._last_end is None else max(start, self._last_end)
        self._last_end = end
        after_mixed, self._last_mixed = self._last_mixed, nbytes is None
        if nbytes is None or after_mixed:
            self._mixed.append(end)
        elif end > begin:
            self._decodes.append((end, nbytes, end - begin))
            self._bytes += nbytes
            self._seconds += end - begin
        self._prune(end)

    def _prune(self, now: float) -> None:
        while self._decodes and now - self._decodes[0][0] > self.window_s:
            _, nbytes, seconds = self._decodes.popleft()
            self._bytes -= nbytes
            self._seconds -= seconds
        while self._mixed and now - self._mixed[0] > self.window_s:
            self._mixed.popleft()
        if not self._decodes:
            self._bytes, self._seconds = 0, 0.0  # no float residue from the running sums

    def report(self) -> dict:
        """The window's figure: achieved GB/s (bytes read over the decode steps' time), the
        peak it is a share of and where that peak comes from; None where there is no decode
        step in the window or no known peak."""
        self._prune(self.clock())
        n = len(self._decodes)
        achieved = self._bytes / self._seconds / 1e9 if n and self._seconds > 0 else None
        share = 100.0 * achieved / self.peak_gbs if achieved and self.peak_gbs else None
        return {
            "achieved_gbs": achieved,
            "peak_gbs": self.peak_gbs,
            "peak_source": self.peak_source,
            "share_perc": share,
            "decode_steps": n,
            "bytes_per_step": self._bytes // n if n else None,
            "step_s": self._seconds / n if n else None,
            "mixed_steps": len(self._mixed),
            "window_s": self.window_s,
        }
