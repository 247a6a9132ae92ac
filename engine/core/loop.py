"""CoreLoop: the engine core's busy loop, in its own process. It owns the LLMEngine (or anything
with its contract) and never waits on HTTP work: between steps it takes in whatever commands the
front ends sent (non-blocking), steps, and sends each front end one frame with its requests'
new tokens and the engine's stats. With nothing to run it sleeps in a poll on the socket.

A ROUTER socket serves every front end (one per API worker); each request belongs to the front
end that sent it. A front end that has gone (its socket closed) cannot be sent to: its requests
are aborted, so their KV blocks come back.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import zmq

from engine.core import wire
from engine.scheduling.request import RequestMetrics, RequestOutput

logger = logging.getLogger("engine.core")
IDLE_POLL_MS = 100  # how long an idle loop sleeps before checking that its parent lives
KV_MAP_INTERVAL_S = 0.25  # how often the per-request KV blocks (for the dashboard) are sent


class CoreLoop:
    def __init__(self, engine: Any, sock: zmq.Socket, parent_pid: int | None = None) -> None:
        self.engine = engine
        self.sock = sock
        self.parent_pid = parent_pid
        self.owner: dict[str, bytes] = {}  # request id -> the front end that sent it
        self.sent: dict[str, wire.SentState] = {}
        self.peers: set[bytes] = set()
        self.aborted: set[str] = set()
        self._kv_sent_at = 0.0
        self.last_step_s = 0.0
        self._stopping = False

    def run(self) -> None:
        """Serve until a front end says SHUTDOWN or the parent process is gone."""
        while not self._stopping:
            if not self.engine.has_unfinished() and not self.sock.poll(IDLE_POLL_MS):
                if not self._parent_alive():
                    logger.warning("the front end process is gone: the engine core stops")
                    break
                continue
            accepted = self._take_commands()
            outputs: list[RequestOutput] = []
            if self.engine.has_unfinished() or self.aborted:
                start = time.perf_counter()
                outputs = self.engine.step()
                self.last_step_s = time.perf_counter() - start
            self._send(accepted, outputs)
            if not self._parent_alive():
                break
        self._abort_all()

    # --- commands -------------------------------------------------------------------------
    def _take_commands(self) -> dict[bytes, list]:
        accepted: dict[bytes, list] = {}
        while True:
            try:
                peer, frame = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return accepted
            cmd = wire.unpack(frame)
            self.peers.add(peer)
            kind = cmd[0]
            if kind == wire.ADD:
                accepted.setdefault(peer, []).append(self._add(peer, *cmd[1:]))
            elif kind == wire.ABORT:
                self._abort(cmd[1])
            elif kind == wire.SHUTDOWN:
                self._stopping = True
                self._abort_all()

    def _add(
        self, peer: bytes, request_id: str, prompt, params: dict, arrival: float, images=None
    ) -> list:
        try:
            sampling = wire.params_from_wire(params)
            extra = {"images": wire.images_from_wire(images)} if images else {}
            self.engine.add_request(request_id, prompt, sampling, arrival, **extra)
        except (ValueError, TypeError) as exc:
            return [request_id, str(exc), None]
        self.owner[request_id] = peer
        self.sent[request_id] = wire.SentState()
        return [request_id, None, None if isinstance(prompt, list) else self._prompt_ids(prompt)]

    def _prompt_ids(self, prompt: str) -> list[int]:
        encode = getattr(self.engine, "encode", None) or self.engine.tokenizer.encode
        return list(encode(prompt))

    def _abort(self, request_id: str) -> None:
        if request_id in self.owner:
            self.engine.abort(request_id)
            self.aborted.add(request_id)

    def _abort_all(self) -> None:
        for request_id in list(self.owner):
            self._abort(request_id)

    # --- outputs --------------------------------------------------------------------------
    def _send(self, accepted: dict[bytes, list], outputs: list[RequestOutput]) -> None:
        frames: dict[bytes, list] = {}
        for output in outputs:
            rid = output.request_id
            peer = self.owner.get(rid)
            if peer is None:
                continue
            frames.setdefault(peer, []).append(wire.output_delta(output, self.sent[rid]))
            self.aborted.discard(rid)
            if output.finished:
                del self.owner[rid], self.sent[rid]
        for rid in self.aborted:  # an engine that did not report an abort: close it here
            peer = self.owner.pop(rid, None)
            if peer is not None:
                now = time.time()
                metrics = RequestMetrics(now, finished_time=now)
                closed = RequestOutput(rid, [], [], "", True, "abort", metrics)
                frames.setdefault(peer, []).append(wire.output_delta(closed, self.sent.pop(rid)))
        self.aborted.clear()
        stats = {
            **self.engine.stats(),
            "num_unfinished": len(self.owner),
            "last_step_s": self.last_step_s,
        }
        kv = self._kv_map()
        for peer in self.peers.copy():
            frame = {"s": stats, "a": accepted.get(peer, []), "o": frames.get(peer, [])}
            if kv is not None:
                frame["kv"] = kv
            self._send_to(peer, frame)

    def _send_to(self, peer: bytes, frame: dict) -> None:
        try:
            self.sock.send_multipart([peer, wire.pack(frame)], zmq.NOBLOCK)
        except zmq.ZMQError:  # the front end is gone (ROUTER_MANDATORY): free its requests
            self.peers.discard(peer)
            orphans = [rid for rid, owner in self.owner.items() if owner == peer]
            for rid in orphans:
                self._abort(rid)
            if orphans:
                logger.warning("a front end went away: its %d requests were aborted", len(orphans))

    def tell_dead(self, reason: str) -> None:
        """Tell every front end why the core stops, before the process exits."""
        for peer in self.peers:
            try:
                self.sock.send_multipart([peer, wire.pack({"dead": reason})], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

    def _kv_map(self) -> dict[str, int] | None:
        """KV blocks held by each running request, at most every KV_MAP_INTERVAL_S."""
        now = time.monotonic()
        if now - self._kv_sent_at < KV_MAP_INTERVAL_S:
            return None
        self._kv_sent_at = now
        by_request = getattr(self.engine, "kv_blocks_by_request", None)
        if by_request is not None:
            return dict(by_request())
        scheduler = getattr(self.engine, "scheduler", None)
        if scheduler is None:
            return None
        return {req.request_id: len(req.block_table) for req in scheduler.running}

    def _parent_alive(self) -> bool:
        """Whether the front end that started the core still runs (the forkserver, not it, is
        the core's parent, so ask for the process by pid)."""
        if self.parent_pid is None:
            return True
        try:
            os.kill(self.parent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a pid reused by another user's process: ours is gone
            return False
        return True
