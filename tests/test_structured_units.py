"""The pieces of structured outputs on their own: the bitmask against a dense reference, a
request's grammar state (where the constrained part starts, a reasoning opener), the pool's
masks, and the spec's checks."""

from __future__ import annotations

import time

import pytest
import torch

from engine.structured import StructuredOutput
from engine.structured.bitmask import BitmaskBuffers, allow, apply_bitmask, words_for
from engine.structured.grammar_state import GrammarState, Verdict
from engine.structured.llguidance_backend import LLGuidanceBackend
from engine.structured.pool import GrammarPool
from tests.support.tiny_models import EOS_ID, VOCAB, byte_tokenizer


def _dense(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """[rows, vocab] bool, token by token: bit t % 32 of word t // 32."""
    rows = bitmask.shape[0]
    out = torch.zeros(rows, vocab, dtype=torch.bool)
    for r in range(rows):
        for t in range(vocab):
            out[r, t] = (int(bitmask[r, t // 32]) >> (t % 32)) & 1 == 1
    return out


# --- bitmask.py ---------------------------------------------------------------------------------
@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 100, 320])
def test_apply_bitmask_equals_the_dense_reference(vocab):
    g = torch.Generator().manual_seed(vocab)
    rows = 5
    bitmask = torch.randint(
        -(2**31), 2**31, (rows, words_for(vocab)), generator=g, dtype=torch.int64
    )
    bitmask = bitmask.to(torch.int32)
    bitmask[0] = -1  # every token allowed
    bitmask[1] = 0  # none
    logits = torch.randn(rows, vocab, generator=g)
    masked = apply_bitmask(logits, bitmask)
    allowed = _dense(bitmask, vocab)
    assert torch.equal(masked[allowed], logits[allowed])
    assert torch.all(masked[~allowed] == float("-inf"))
    assert allowed[0].all() and not allowed[1].any()
    assert masked.shape == logits.shape and masked.dtype == logits.dtype


def test_apply_bitmask_keeps_a_16_bit_dtype():
    logits = torch.randn(2, 64, dtype=torch.bfloat16)
    bitmask = torch.tensor([[0x0000FFFF, 0], [-1, 1 << 5]], dtype=torch.int32)
    masked = apply_bitmask(logits, bitmask)
    assert masked.dtype == torch.bfloat16
    assert torch.isfinite(masked[0, :16]).all() and torch.isinf(masked[0, 16:]).all()
    assert torch.isfinite(masked[1, :32]).all()
    assert torch.isfinite(masked[1, 37]) and torch.isinf(masked[1, 32:37]).all()


@pytest.mark.parametrize("token", [0, 1, 30, 31, 32, 63, 64, 95, 319])
def test_allow_sets_one_bit_even_the_sign_bit(token):
    bitmask = torch.zeros(2, words_for(VOCAB), dtype=torch.int32)
    allow(bitmask, 1, token)
    allowed = _dense(bitmask, VOCAB)
    assert allowed[1].nonzero().flatten().tolist() == [token] and not allowed[0].any()
    allow(bitmask, 1, token)  # idempotent
    allow(bitmask, 1, 5)
    assert _dense(bitmask, VOCAB)[1].nonzero().flatten().tolist() == sorted({token, 5})


def test_allow_on_a_word_whose_sign_bit_is_set_keeps_it():
    bitmask = torch.tensor([[-(2**31)]], dtype=torch.int32)  # only token 31
    allow(bitmask, 0, 3)
    assert _dense(bitmask, 32)[0].nonzero().flatten().tolist() == [3, 31]
    full = torch.full((1, 1), -1, dtype=torch.int32)
    allow(full, 0, 31)
    assert int(full[0, 0]) == -1


def test_words_for_rounds_up():
    assert [words_for(v) for v in (1, 32, 33, 64, 49152, 128256)] == [1, 1, 2, 2, 1536, 4008]


def test_buffers_alternate_and_start_all_allowed():
    buffers = BitmaskBuffers(max_rows=4, vocab_size=100, device=torch.device("cpu"))
    a = buffers.take(3)
    assert a.shape == (3, 4) and a.dtype == torch.int32 and bool((a == -1).all())
    a.zero_()
    b = buffers.take(2)
    assert b.data_ptr() != a.data_ptr() and bool((b == -1).all())
    assert bool((a == 0).all())  # the step before's rows are left as they were
    c = buffers.take(4)
    assert c.data_ptr() == a.data_ptr() and bool((c == -1).all())


# --- state.py -------------------------------------------------------------------------------------
class ScriptedMatcher:
    """Accepts exactly `script`, then is terminated."""

    def __init__(self, script: list[int]) -> None:
        self.script = script
        self.accepted: list[int] = []

    def accept(self, token_id: int) -> bool:
        if len(self.accepted) >= len(self.script) or self.script[len(self.accepted)] != token_id:
            return False
        self.accepted.append(token_id)
        return True

    def rollback(self, num_tokens: int) -> None:
        del self.accepted[len(self.accepted) - num_tokens :]

    @property
    def is_terminated(self) -> bool:
        return self.accepted == self.script


def test_without_a_start_the_grammar_applies_from_the_first_token():
    m = ScriptedMatcher([1, 2, 3])
    state = GrammarState(m, "regex", 0.001)
    assert state.needs_mask and state.extra_allowed is None
    assert [state.accept(t) for t in (1, 2)] == [Verdict.GOING] * 2
    assert state.accept(3) is Verdict.DONE
    assert m.accepted == [1, 2, 3] and state.num_accepted == 3


def test_a_token_the_grammar_refuses_is_reported():
    state = GrammarState(ScriptedMatcher([1, 2]), "regex", 0.0)
    assert state.accept(1) is Verdict.GOING
    assert state.accept(9) is Verdict.REFUSED
    assert state.num_accepted == 1


def test_start_after_leaves_tokens_free_until_the_start_text_then_constrains():
    m = ScriptedMatcher([5, 6])
    state = GrammarState(m, "json_schema", 0.0, start_ids=(7, 8))
    assert not state.needs_mask
    for t in (7, 9, 8, 7, 7):  # 7 then 8 apart, and 7 7, do not open it
        assert state.accept(t) is Verdict.GOING and not state.needs_mask
    assert state.accept(8) is Verdict.GOING and state.needs_mask  # ...7, 8 does
    assert m.accepted == []  # the start text itself is not the grammar's
    assert state.accept(5) is Verdict.GOING
    assert state.accept(6) is Verdict.DONE and m.accepted == [5, 6]


def test_reasoning_open_as_first_token_defers_the_grammar_to_the_start_text():
    m = ScriptedMatcher([5])
    state = GrammarState(m, "json_schema", 0.0, start_ids=(8,), open_id=4)
    assert state.needs_mask and state.extra_allowed == 4  # the grammar's tokens, or the opener
    assert state.accept(4) is Verdict.GOING
    assert not state.needs_mask and state.extra_allowed is None
    for t in (1, 4, 2):
        assert state.accept(t) is Verdict.GOING and not state.needs_mask
    assert state.accept(8) is Verdict.GOING and state.needs_mask
    assert state.accept(5) is Verdict.DONE and m.accepted == [5]


def test_without_the_opener_first_the_grammar_applies_at_once():
    m = ScriptedMatcher([5, 4])
    state = GrammarState(m, "json_schema", 0.0, start_ids=(8,), open_id=4)
    assert state.accept(5) is Verdict.GOING and state.extra_allowed is None
    assert state.needs_mask
    assert state.accept(4) is Verdict.DONE  # the opener later is the grammar's own token
    assert m.accepted == [5, 4]


def test_an_opener_without_a_start_text_is_ignored():
    state = GrammarState(ScriptedMatcher([4]), "regex", 0.0, start_ids=None, open_id=4)
    assert state.open_id is None and state.extra_allowed is None and state.needs_mask
    assert state.accept(4) is Verdict.DONE


def test_summary_reports_compile_and_mask_times():
    state = GrammarState(ScriptedMatcher([1]), "choice", 0.0025)
    for seconds in (0.001, 0.003):
        state.record_mask(seconds)
    state.accept(1)
    assert state.summary() == {
        "kind": "choice",
        "compile_ms": 2.5,
        "mask_steps": 2,
        "mask_ms_mean": 2.0,
        "mask_ms_max": 3.0,
        "tokens_accepted": 1,
    }


# --- pool.py with llguidance on the byte tokenizer ---------------------------------------------
@pytest.fixture(scope="module")
def pool():
    tokenizer = byte_tokenizer()
    p = GrammarPool(
        lambda: LLGuidanceBackend(tokenizer, VOCAB, {EOS_ID}), 4, VOCAB, torch.device("cpu")
    )
    yield p
    p.close()


def _compiled(pool, spec: StructuredOutput, **kw) -> GrammarState:
    backend = pool.backend
    return GrammarState(backend.matcher(backend.compile(spec)), spec.kind, 0.0, **kw)


def _allowed_row(bitmask, row: int) -> list[int]:
    return _dense(bitmask, VOCAB)[row].nonzero().flatten().tolist()


def test_pool_masks_constrained_rows_only(pool):
    digits = _compiled(pool, StructuredOutput("regex", "[0-9]{2}"))
    choice = _compiled(pool, StructuredOutput.choice(["ab", "c"]))
    bitmask = pool.masks([(0, digits), (2, choice)], num_rows=3)
    assert _allowed_row(bitmask, 0) == list(range(ord("0"), ord("9") + 1))
    assert _allowed_row(bitmask, 1) == list(range(VOCAB))  # a free request's row
    assert _allowed_row(bitmask, 2) == [ord("a"), ord("c")]
    assert digits.mask_steps == choice.mask_steps == 1
    assert digits.accept(ord("4")) is Verdict.GOING
    assert digits.accept(ord("2")) is Verdict.DONE
    assert choice.accept(ord("c")) is Verdict.DONE


def test_pool_masks_nothing_while_no_grammar_is_active(pool):
    waiting = _compiled(pool, StructuredOutput("regex", "[0-9]"), start_ids=(ord(">"),))
    assert pool.masks([(0, waiting)], num_rows=2) is None
    waiting.accept(ord(">"))
    assert _allowed_row(pool.masks([(0, waiting)], num_rows=1), 0) == list(range(48, 58))


def test_pool_allows_the_reasoning_opener_on_the_first_step_only(pool):
    opener = ord("<")
    state = _compiled(
        pool, StructuredOutput("regex", "[0-9]+"), start_ids=(ord(">"),), open_id=opener
    )
    first = _allowed_row(pool.masks([(0, state)], num_rows=1), 0)
    assert first == sorted([opener, *range(48, 58)])
    state.accept(ord("7"))
    after = _allowed_row(pool.masks([(0, state)], num_rows=1), 0)
    assert opener not in after and set(range(48, 58)) <= set(after)


def test_end_of_sequence_is_allowed_where_the_grammar_may_stop(pool):
    state = _compiled(pool, StructuredOutput("regex", "[0-9]+"))
    state.accept(ord("1"))
    allowed = _allowed_row(pool.masks([(0, state)], num_rows=1), 0)
    assert allowed == sorted([EOS_ID, *range(48, 58)])
    assert state.accept(EOS_ID) is Verdict.DONE


def test_pool_compiles_beside_the_caller_and_reports_errors(pool):
    class Req:
        def __init__(self, rid, spec):
            self.request_id = rid
            self.params = type("P", (), {"structured": spec})

    good = Req("good", StructuredOutput.json_schema({"type": "integer"}))
    bad = Req("bad", StructuredOutput.json_schema({"not": {}}))
    pool.submit(good, None, None)
    pool.submit(bad, None, None)
    assert len(pool) == 2
    results: dict = {}
    deadline = time.monotonic() + 30
    while len(results) < 2 and time.monotonic() < deadline:
        results.update({r.request_id: s for r, s in pool.ready()})
        time.sleep(0.005)
    assert isinstance(results["good"], GrammarState) and results["good"].kind == "json_schema"
    assert isinstance(results["bad"], ValueError) and "not" in str(results["bad"])
    assert len(pool) == 0 and pool.cancel("good") is None


# --- spec.py --------------------------------------------------------------------------------------
def test_spec_refuses_an_unknown_kind_and_round_trips():
    with pytest.raises(ValueError, match="json_schema"):
        StructuredOutput("xml")
    spec = StructuredOutput.json_schema({"type": "integer"}, start_after="</think>")
    assert StructuredOutput(**spec.to_dict()) == spec
    assert StructuredOutput.choice(["a", "b"]).value == '["a", "b"]'
