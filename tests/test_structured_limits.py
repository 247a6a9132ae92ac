"""A slow grammar compile: the engine keeps stepping other requests while it runs, and the
front end's check answers 400 once it passes --grammar-timeout, then keeps serving."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from appliance.server.errors import APIError
from appliance.server.request_grammar import GrammarCheck
from engine import LLM, SamplingParams
from engine.llm_engine import COMPILE_WAIT_S
from engine.structured import StructuredOutput
from engine.text.tokenizer import load_tokenizer

CHOICE = StructuredOutput.choice(["yes", "no"])


def _slowed(backend, release: threading.Event, delay: float | None = None):
    compile_now = backend.compile

    def slow(spec):
        if delay is not None:
            time.sleep(delay)
        else:
            release.wait(30)
        return compile_now(spec)

    backend.compile = slow


def test_a_slow_compile_never_holds_up_other_requests(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_seqs=4, max_model_len=256)
    engine, release = llm.engine, threading.Event()
    _slowed(engine.grammars.backend, release)
    engine.add_request("slow", [1, 2, 3], SamplingParams(max_tokens=4, structured=CHOICE))
    engine.add_request("free", [4, 5, 6], SamplingParams(max_tokens=8, ignore_eos=True))
    finished = {}
    while "free" not in finished:
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert "slow" not in finished and len(engine.grammars) == 1
    assert engine.stats()["num_waiting"] == 1  # the compiling request counts as waiting
    release.set()
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    slow = finished["slow"]
    assert slow.finish_reason == "stop" and slow.text in ("yes", "no")
    events = [e.event for e in slow.trace]
    assert events.index("grammar_compiling") < events.index("grammar_compiled")
    assert slow.trace[events.index("grammar")].detail["kind"] == "choice"


def test_abort_while_compiling_ends_the_request(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_seqs=4, max_model_len=256)
    engine, release = llm.engine, threading.Event()
    _slowed(engine.grammars.backend, release)
    engine.add_request("slow", [1, 2, 3], SamplingParams(max_tokens=4, structured=CHOICE))
    engine.abort("slow")
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs] == [("slow", "abort")]
    release.set()
    assert not engine.has_unfinished()


def test_a_step_with_only_a_compile_to_wait_for_waits_instead_of_spinning(tiny_llama):
    llm = LLM(str(tiny_llama), device="cpu", max_num_seqs=4, max_model_len=256)
    engine, release = llm.engine, threading.Event()
    _slowed(engine.grammars.backend, release)
    engine.add_request("slow", [1, 2, 3], SamplingParams(max_tokens=4, structured=CHOICE))
    start, steps = time.perf_counter(), 0
    while time.perf_counter() - start < 0.2:
        assert engine.step() == []
        steps += 1
    assert steps <= 0.2 / COMPILE_WAIT_S + 1  # each step waited for the compile
    threading.Timer(0.05, release.set).start()
    start = time.perf_counter()
    while not engine.scheduler.num_unfinished:  # queued by the step the compile ended in
        engine.step()
    assert time.perf_counter() - start < 5
    while engine.has_unfinished():
        engine.step()


async def test_a_compile_past_the_limit_is_a_400_and_the_next_one_compiles(tiny_llama):
    tokenizer = load_tokenizer(tiny_llama)
    info = SimpleNamespace(
        tokenizer=tokenizer, vocab_size=len(tokenizer), logits_size=320, eos_token_ids={256}
    )
    check = GrammarCheck(info, timeout_s=0.05)
    try:
        _slowed(check.backend(), threading.Event(), delay=0.5)
        with pytest.raises(APIError) as err:
            await check.check(CHOICE, "choice")
        assert err.value.status == 400 and "took longer than 0.05 s" in err.value.message
        assert err.value.param == "choice"
        check.timeout_s = 5.0
        assert await check.check(CHOICE, "choice") >= 0.5
        with pytest.raises(APIError, match="Unimplemented keys"):
            await check.check(StructuredOutput.json_schema({"not": {}}), "response_format")
    finally:
        check.close()
