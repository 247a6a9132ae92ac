"""Compiling requests' grammars beside the step loop: a request with a grammar waits here until
its matcher is ready, so a slow compile never holds up another request's step."""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from engine.scheduling.request import RequestStatus
from engine.structured.backend import GrammarBackend
from engine.structured.bitmask import BitmaskBuffers, allow
from engine.structured.grammar_state import GrammarState

COMPILE_THREADS = 2


class GrammarPool:
    def __init__(self, make_backend, max_rows: int, vocab_size: int, device) -> None:
        """make_backend: builds the GrammarBackend (reading the tokenizer takes a fraction of a
        second, so it runs on the pool too, started now)."""
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self._backend: Future[GrammarBackend] = self._executor.submit(make_backend)
        self._compiling: dict[str, tuple[object, Future]] = {}
        self._buffers = BitmaskBuffers(max_rows, vocab_size, device)
        self._encode = None

    @property
    def backend(self) -> GrammarBackend:
        return self._backend.result()

    def __len__(self) -> int:
        return len(self._compiling)

    def submit(self, req, start_ids, open_id) -> None:
        """Compile req.params.structured; the request comes back from ready()."""
        spec = req.params.structured

        def build() -> GrammarState:
            backend = self.backend
            start = time.perf_counter()
            compiled = backend.compile(spec)
            matcher = backend.matcher(compiled)
            seconds = time.perf_counter() - start
            return GrammarState(matcher, spec.kind, seconds, start_ids, open_id)

        self._compiling[req.request_id] = (req, self._executor.submit(build))

    def cancel(self, request_id: str):
        """Drop a compiling request (aborted); returns it, or None when it is not here."""
        entry = self._compiling.pop(request_id, None)
        return None if entry is None else entry[0]

    def ready(self) -> list[tuple[object, GrammarState | Exception]]:
        """Requests whose compile ended: (request, its grammar state or the error)."""
        done = [rid for rid, (_, fut) in self._compiling.items() if fut.done()]
        out = []
        for rid in done:
            req, fut = self._compiling.pop(rid)
            error = fut.exception()
            out.append((req, error if error is not None else fut.result()))
        return out

    def admit_ready(self, scheduler) -> list:
        """Queue on `scheduler` the requests whose grammar is ready; one whose compile failed
        ends here (aborted, the error as its stop reason). Returns those that failed."""
        failed = []
        for req, result in self.ready():
            if isinstance(result, Exception):
                req.stop_reason = f"grammar error: {result}"
                req.finish(RequestStatus.FINISHED_ABORTED)
                failed.append(req)
            else:
                req.grammar = result
                req.record("grammar_compiled", ms=round(result.compile_s * 1e3, 3))
                scheduler.add(req)
        return failed

    def wait(self, timeout_s: float) -> None:
        """Block until a compile ends or `timeout_s` passes (the step loop, with nothing else to
        do, waits here instead of spinning and taking the compile threads' interpreter time)."""
        futures = [fut for _, fut in self._compiling.values()]
        if futures:
            wait(futures, timeout=timeout_s, return_when=FIRST_COMPLETED)

    def masks(self, rows: list[tuple[int, GrammarState]], num_rows: int) -> torch.Tensor | None:
        """The step's bitmask for `num_rows` sampled rows, or None when no row is constrained
        now. rows: (row, grammar state) of the constrained requests."""
        active = [(row, state) for row, state in rows if state.needs_mask]
        if not active:
            return None
        start = time.perf_counter()
        bitmask = self._buffers.take(num_rows)
        self.backend.fill([(state.matcher, row) for row, state in active], bitmask)
        for row, state in active:
            if state.extra_allowed is not None:
                allow(bitmask, row, state.extra_allowed)
        seconds = time.perf_counter() - start
        for _, state in active:
            state.record_mask(seconds)
        return bitmask

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
