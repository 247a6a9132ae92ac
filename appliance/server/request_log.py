"""RequestLog: one JSON line per closed request, written by its own thread.

Handlers only enqueue (never block); a slow or stuck disk can neither slow generation nor the
event loop. If the queue fills up, lines are dropped and counted, never waited for. Keys and
prompts are never written: the key's name, ids, counts and timings are.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from pathlib import Path

from appliance.server.records import RequestRecord

logger = logging.getLogger("appliance.server")
_STOP = object()


class RequestLog:
    def __init__(self, path: str | Path, max_pending: int = 10_000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._queue: queue.Queue = queue.Queue(max_pending)
        self.num_dropped = 0
        self._thread = threading.Thread(target=self._run, name="request-log", daemon=True)
        self._thread.start()

    def write(self, record: RequestRecord) -> None:
        """Enqueue a closed record (called on the event loop; never blocks)."""
        line = {
            **record.summary(),
            "model": record.model,
            "key_name": record.key_name,
            "stream": record.stream,
            "sampling": record.sampling,
        }
        try:
            self._queue.put_nowait(line)
        except queue.Full:
            self.num_dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued and stop the writer thread."""
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            f = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            logger.error("cannot open request log %s: %s", self.path, exc)
            return
        with f:
            while True:
                item = self._queue.get()
                batch = [item]
                while not self._queue.empty() and len(batch) < 256:
                    batch.append(self._queue.get_nowait())
                for line in batch:
                    if line is not _STOP:
                        f.write(json.dumps(line, ensure_ascii=False) + "\n")
                f.flush()
                if any(line is _STOP for line in batch):
                    return
