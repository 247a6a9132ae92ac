"""Fakes for the dashboard's trace screen: the /v1/requests/{id} trace of one of tui_fakes.ROWS'
requests (a cached prefix, a preemption, a grammar, speculative drafts)."""

from __future__ import annotations

from tests.support.tui_fakes import ROWS, T0, request_row


def make_trace(request_id: str = "req-done-e", spec: bool = False) -> dict:
    """A finished request that starts from a cached prefix, with one preemption; a structured
    one also compiles its grammar before it is scheduled and reports its mask time at the end;
    with `spec`, its drafted and accepted tokens just before it finishes (as the engine does)."""
    summary = next(request_row(s, 0) for s in ROWS if s[0] == request_id)
    structured = summary["structured"]
    events = [
        (0.0, "server", None, "received", None),
        (0.0, "engine", 0, "arrived", None),
        (0.1, "server", None, "admitted", {"num_choices": 1}),
        (0.2, "server", None, "queued", {"engine_ids": [request_id]}),
        (20.0, "engine", 0, "scheduled", None),
        (20.0, "engine", 0, "prefix_cache_hit", {"tokens": summary["cached_tokens"]}),
        (20.0, "engine", 0, "prefill_chunk", {"tokens": 244, "start": 256}),
        (110.0, "engine", 0, "first_token", None),
        (900.0, "engine", 0, "preempted", None),
        (1300.0, "engine", 0, "scheduled", None),
        (1300.0, "engine", 0, "prefill_chunk", {"tokens": 500, "start": 0}),
        (1380.0, "engine", 0, "first_token", None),
        (3190.0, "engine", 0, "finished", {"reason": "length"}),
        (3200.0, "server", None, "closed", {"status": "finished", "http_status": 200}),
    ]
    grammar = None
    if structured:
        kind = "grammar" if structured == "tool_call" else structured  # the engine's kind
        grammar = {
            "kind": kind,
            "compile_ms": 1.1,
            "mask_steps": summary["completion_tokens"],
            "mask_ms_mean": 0.048,
            "mask_ms_max": 0.21,
            "tokens_accepted": summary["completion_tokens"],
        }
        finished = next(i for i, e in enumerate(events) if e[3] == "finished")
        events.insert(finished, (3190.0, "engine", 0, "grammar", grammar))  # as the engine does
        events += [
            (0.05, "engine", 0, "grammar_compiling", {"kind": kind}),
            (1.2, "engine", 0, "grammar_compiled", {"ms": 1.1}),
        ]
        events.sort(key=lambda e: e[0])  # stable: "grammar" stays before "finished"
    if spec:
        finished = next(i for i, e in enumerate(events) if e[3] == "finished")
        events.insert(finished, (3190.0, "engine", 0, "spec", {"drafted": 120, "accepted": 74}))
    out = []
    for t_ms, source, choice, event, detail in events:
        e = {"time": T0 + t_ms / 1000, "event": event, "source": source, "t_ms": t_ms}
        if choice is not None:
            e["choice"] = choice
        if detail:
            e["detail"] = detail
        out.append(e)
    choice = {
        "index": 0,
        "engine_id": request_id,
        "prompt_tokens": summary["prompt_tokens"],
        "cached_tokens": summary["cached_tokens"],
        "completion_tokens": summary["completion_tokens"],
        "finish_reason": summary["finish_reasons"][0],
        "queue_s": summary["queue_s"],
        "tpot_s": summary["tpot_s"],
        "num_preemptions": summary["num_preemptions"],
        "grammar": grammar,
    }
    summary.pop("kv_blocks")  # a /v1/stats row's, not a trace's
    sampling = {
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,
        "repetition_penalty": 1.0,
        "max_tokens": 256,
        "sources": {"temperature": "request", "max_tokens": "request"},
    }
    return {
        **summary,
        "key_name": None,
        "stream": True,
        "sampling": sampling,
        "choices": [choice],
        "events": out,
    }
