"""A launched step whose sampled tokens are still on the device.

Overlap: the engine launches step N+1 before it reads step N's tokens back, so the GPU never
waits for the Python that schedules, prepares and reports. The tokens travel to pinned host
memory by a non-blocking copy followed by an event; `collect` waits on that event alone (a
plain `.tolist()` would wait for everything queued since, step N+1 included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.runner.sampler import SamplerOutput
from engine.scheduling.request import Logprob
from engine.scheduling.scheduler import ScheduledBatch


def _to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.device.type == "cpu":
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    return host.copy_(t, non_blocking=True)


def request_rows(batch: ScheduledBatch, sampling_rows: list[int]) -> dict[int, int]:
    """id(request) -> its row of the step's sampled tokens."""
    return {id(batch.requests[i]): row for row, i in enumerate(sampling_rows)}


@dataclass
class PendingStep:
    batch: ScheduledBatch
    sampling_rows: list[int]
    """Batch index of each sampled row, in row order."""
    out: SamplerOutput | None
    """Device results (kept alive for the next step's placeholder inputs)."""
    host: SamplerOutput | None = None
    event: torch.cuda.Event | None = None
    rows: dict[int, int] = field(default_factory=dict)
    """id(request) -> its row of out.token_ids."""

    @classmethod
    def launched(
        cls, batch: ScheduledBatch, sampling_rows: list[int], out: SamplerOutput | None
    ) -> PendingStep:
        """Start the copies back to the host; nothing here waits for the device."""
        step = cls(batch, sampling_rows, out)
        step.rows = request_rows(batch, sampling_rows)
        if out is not None:
            step.host = SamplerOutput(*(_to_host(t) for t in vars(out).values()))
            if out.token_ids.device.type == "cuda":
                step.event = torch.cuda.Event()
                step.event.record()
        return step

    def collect(self) -> dict[int, tuple[int, Logprob | None]]:
        """Wait for this step's tokens; batch index -> (token, logprob)."""
        if self.host is None:
            return {}
        if self.event is not None:
            self.event.synchronize()
        tokens = self.host.token_ids.tolist()
        if self.host.logprobs is None:
            return {i: (tokens[row], None) for row, i in enumerate(self.sampling_rows)}
        chosen = self.host.logprobs.tolist()
        top_ids, top_lps = self.host.top_ids.tolist(), self.host.top_logprobs.tolist()
        result: dict[int, tuple[int, Logprob | None]] = {}
        for row, i in enumerate(self.sampling_rows):
            n = self.batch.requests[i].params.logprobs
            logprob = None
            if n is not None:
                top = list(zip(top_ids[row][:n], top_lps[row][:n]))
                logprob = Logprob(tokens[row], chosen[row], top)
            result[i] = (tokens[row], logprob)
        return result
