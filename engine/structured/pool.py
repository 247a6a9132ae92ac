"""Compiling requests' grammars beside the step loop: a request with a grammar waits here until
its matcher is ready, so a slow compile never holds up another request's step."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait

import torch

from engine.scheduling.request import RequestStatus
from engine.structured.backend import GrammarBackend
from engine.structured.bitmask import BitmaskBuffers, allow
from engine.structured.grammar_state import GrammarState

COMPILE_THREADS = 2
THREAD_MIN_ROWS = 8
"""A step with at least this many constrained rows fills its masks on the mask thread (one call
that releases the GIL), while the engine's thread reports tokens and prepares the next forward;
a step with fewer fills them inline, where the hand-over would cost more than it hides."""


class GrammarPool:
    def __init__(self, make_backend, max_rows: int, vocab_size: int, device) -> None:
        """make_backend: builds the GrammarBackend (reading the tokenizer takes a fraction of a
        second, so it runs on the pool too, started now)."""
        self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="grammar")
        self._backend: Future[GrammarBackend] = self._executor.submit(make_backend)
        self._compiling: dict[str, tuple[object, Future]] = {}
        self._buffers = BitmaskBuffers(max_rows, vocab_size, device)
        self._mask_thread = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
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
        return self.begin_masks(rows, num_rows, on_thread=False)()

    def begin_masks(
        self, rows: list[tuple[int, GrammarState]], num_rows: int, on_thread: bool = True
    ) -> Callable[[], torch.Tensor | None]:
        """Start filling the step's bitmask (as `masks`); the returned call waits for it. Until
        then the caller must not advance these requests' grammars. on_thread: fill on the mask
        thread when there are THREAD_MIN_ROWS rows or more (False: inline)."""
        active = [(row, state) for row, state in rows if state.needs_mask]
        if not active:
            return lambda: None
        bitmask = self._buffers.take(num_rows)
        pairs = [(state.matcher, row) for row, state in active]
        if not on_thread or len(pairs) < THREAD_MIN_ROWS:
            seconds = self._fill(pairs, bitmask)
            return lambda: self._finish(active, bitmask, seconds)
        filling = self._mask_thread.submit(self._fill, pairs, bitmask)
        return lambda: self._finish(active, bitmask, filling.result())

    def _fill(self, pairs: list, bitmask: torch.Tensor) -> float:
        start = time.perf_counter()
        self.backend.fill(pairs, bitmask)
        return time.perf_counter() - start

    @staticmethod
    def _finish(active: list, bitmask: torch.Tensor, seconds: float) -> torch.Tensor:
        for row, state in active:
            if state.extra_allowed is not None:
                allow(bitmask, row, state.extra_allowed)
            state.record_mask(seconds)
        return bitmask

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._mask_thread.shutdown(wait=False, cancel_futures=True)
