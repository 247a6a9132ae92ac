"""Fakes for the dashboard's models table: a /v1/stats document of a server with several
models (two loaded with their own figures, one unloaded, one that failed to load), built on
tui_fakes.make_doc. tests/test_stats_models.py keeps its shape honest against the server."""

from __future__ import annotations

import copy

from tests.support.tui_fakes import make_doc
from tui.models import MODEL_SECTIONS as SECTIONS

SMOL, QWEN, LLAMA, BROKEN = "smol", "qwen-0.5b", "llama-8b", "broken"
GIB = 2**30
# name, status, planned GiB, running, admitted, finished, seconds before the doc's time it was
# last asked for (None: never), error
MODELS = [
    (SMOL, "loaded", 0.4, 4, 60, 50, 2.0, None),
    (QWEN, "loaded", 1.5, 1, 9, 8, 40.0, None),
    (LLAMA, "unloaded", 16.0, 0, 0, 0, None, None),
    (BROKEN, "failed", None, 0, 1, 0, 300.0, "unknown model_type 'no-such-family'"),
]
QWEN_KV = (700, 1024)
"""qwen-0.5b's KV blocks used and total at step 0 (smol's are make_doc's, 113/512)."""


def _qwen_sections(step: int) -> dict:
    """qwen-0.5b's figures: its own config, KV, queue, throughput and two requests."""
    base = make_doc(step)
    used, total = QWEN_KV[0] + 10 * step, QWEN_KV[1]
    sections = {k: copy.deepcopy(base[k]) for k in SECTIONS}
    sections["model"] = QWEN
    sections["model_params"] = {"total": 494_032_768, "active": 494_032_768}
    sections["config"].update(max_model_len=4096, max_num_seqs=8)
    sections["engine"].update(
        kv_blocks_used=used,
        kv_blocks_total=total,
        kv_usage_perc=100 * used / total,
        num_running=1,
        num_waiting=0,
    )
    sections["kv"].update(blocks_used=used, blocks_total=total, usage_perc=100 * used / total)
    sections["queue"].update(num_waiting=0, num_running=1, rejected_total=0, timed_out_total=0)
    sections["throughput"].update(prompt_tokens_per_s=99.0, generation_tokens_per_s=21.5)
    sections["requests_in_flight"] = 1
    sections["requests"] = [
        {**base["requests"][0], "id": "qwen-run-1"},
        {**base["requests"][4], "id": "qwen-done-2"},
    ]
    return sections


def make_models_doc(step: int = 0) -> dict:
    """The /v1/stats document of a server with MODELS at `step`: the top level is smol's (the
    model used last), by_model holds the two loaded models' sections."""
    doc = make_doc(step)
    now = doc["time"]
    doc["model"] = SMOL
    doc["models"] = [
        {
            "name": name,
            "status": status,
            "error": error,
            "memory_bytes": None if gib is None else int(gib * GIB),
            "pinned": name == SMOL,
            "requests": running,
            "requests_total": admitted,
            "finished_total": finished,
            "rejected_total": 0,
            "timed_out_total": 0,
            "last_request_at": None if ago is None else now - ago,
        }
        for name, status, gib, running, admitted, finished, ago, error in MODELS
    ]
    doc["by_model"] = {
        SMOL: {k: copy.deepcopy(doc[k]) for k in SECTIONS},
        QWEN: _qwen_sections(step),
    }
    return doc


def never_used(doc: dict) -> dict:
    """`doc` before any request: no model has been asked for yet."""
    doc = copy.deepcopy(doc)
    for row in doc["models"]:
        row["last_request_at"] = None
    return doc
