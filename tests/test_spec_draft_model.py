"""Speculative decoding with a draft model (speculative="draft:PATH"): the same tokens as
without speculation (greedy and seeded, at several k, under preemption and chunked prefill,
with stop tokens and strings), a draft equal to the target accepting every draft, the draft's
K/V planned in the same blocks, and clear errors for a draft that cannot serve the target."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.models.model_config import ModelConfig
from tests.support.tiny_models import VOCAB, byte_tokenizer, make_tiny_model, tiny_config

NEW_TOKENS = 40
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)


def _prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(2)
    lengths = (7, 19, 33, 50)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lengths]


@pytest.fixture(scope="module")
def near_draft(tiny_llama, tmp_path_factory):
    """The target's weights with 5% noise: it agrees with the target often, not always."""
    folder = tmp_path_factory.mktemp("draft-near")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(folder)
    byte_tokenizer().save_pretrained(folder)
    return folder


def _smaller(config):
    """One layer, 2 heads of 16, one KV head: another shape than the tiny target's."""
    config.update(
        dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=16,
            tie_word_embeddings=True,
        )
    )
    return config


@pytest.fixture(scope="module")
def small_draft(tmp_path_factory):
    """A smaller model of another shape (one layer, 2 heads of 16, one KV head), same vocab."""
    folder = tmp_path_factory.mktemp("draft-small")
    config = _smaller(tiny_config("llama"))
    return make_tiny_model(config, folder, seed=4)


@pytest.fixture(scope="module")
def plain(tiny_llama):
    return [o.token_ids for o in LLM(str(tiny_llama), device="cpu").generate(_prompts(), GREEDY)]


def _draft(target, draft, k: int | None = 3, **config) -> LLM:
    return LLM(
        str(target),
        device="cpu",
        speculative=f"draft:{draft}",
        num_speculative_tokens=k,
        **config,
    )


def _assert_all_returned(llm: LLM) -> None:
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and not any(bm.ref_counts)


def test_a_draft_equal_to_the_target_has_every_draft_accepted(tiny_llama, plain):
    llm = _draft(tiny_llama, tiny_llama, k=4)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == plain
    c = llm.engine.spec.counters
    assert c.num_draft_tokens > 0 and c.num_accepted_tokens == c.num_draft_tokens
    # 40 tokens: the prefill's, then steps of 5 (4 accepted + the target's), the last cut
    # short by max_tokens
    assert c.num_drafts == len(outs) * 8
    _assert_all_returned(llm)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_tokens_are_the_same_at_each_k(tiny_llama, near_draft, plain, k):
    llm = _draft(tiny_llama, near_draft, k=k)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == plain
    c = llm.engine.spec.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens  # some accepted, some rejected
    assert sum(o.metrics.num_accepted_tokens for o in outs) == c.num_accepted_tokens
    _assert_all_returned(llm)


@pytest.mark.parametrize("which", ["equal", "small"])
def test_under_preemption_and_chunked_prefill(tiny_llama, small_draft, plain, which):
    """12 blocks of 16 tokens for four requests of up to 90 tokens: requests are preempted
    and recomputed, and prompts come in 24-token chunks. The draft model's K/V live in the
    same blocks (the small draft's with another head count and dim) and are rebuilt after a
    preemption: a draft equal to the target still has every draft accepted."""
    config = dict(num_kv_blocks=12, max_num_batched_tokens=24, max_model_len=96, max_num_seqs=4)
    draft = tiny_llama if which == "equal" else small_draft
    llm = _draft(tiny_llama, draft, k=3, **config)
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == plain
    assert sum(o.metrics.num_preemptions for o in outs) > 0
    c = llm.engine.spec.counters
    assert c.num_drafts > 0
    if which == "equal":
        assert c.num_accepted_tokens == c.num_draft_tokens
    _assert_all_returned(llm)


def test_kept_draft_kv_drafts_what_recomputing_it_drafts(tiny_llama, near_draft):
    """After rejections the drafter keeps only the draft K/V of kept tokens: it drafts the same
    tokens as a drafter that recomputes each request's whole context every step."""
    kept = _draft(tiny_llama, near_draft, k=4)
    fresh = _draft(tiny_llama, near_draft, k=4)
    drafter = fresh.engine.spec.drafter
    propose = drafter.propose

    def forgetting(requests, k):
        drafter._computed.clear()
        return propose(requests, k)

    drafter.propose = forgetting
    kept.generate(_prompts(), GREEDY)
    fresh.generate(_prompts(), GREEDY)
    a, b = kept.engine.spec.counters, fresh.engine.spec.counters
    assert 0 < a.num_accepted_tokens < a.num_draft_tokens
    assert (a.num_drafts, a.num_accepted_tokens) == (b.num_drafts, b.num_accepted_tokens)


def test_seeded_sampling_is_the_same_on_and_off(tiny_llama, near_draft):
    params = [
        SamplingParams(max_tokens=30, temperature=0.8, seed=s, top_k=50, ignore_eos=True)
        for s in range(4)
    ]
    prompts = _prompts()
    off = LLM(str(tiny_llama), device="cpu").generate(prompts, params)
    llm = _draft(tiny_llama, near_draft, k=3)
    on = llm.generate(prompts, params)
    assert [o.token_ids for o in on] == [o.token_ids for o in off]
    assert llm.engine.spec.counters.num_accepted_tokens > 0


def _stop_at(llm: LLM, plain) -> tuple[int, int, str]:
    """(request, output index, character) of a token inside a step's run that ends the text
    with a character (no replacement character) first appearing there."""
    decode = llm.engine.tokenizer.decode
    for i, out in enumerate(plain):
        for index in range(1, len(out)):
            before, text = decode(out[:index]), decode(out[: index + 1])
            char = text[len(before) :]
            if index % 5 and len(char) == 1 and char != "\ufffd" and char not in before:
                return i, index, char
    raise AssertionError("no token in the outputs ends the text with a new character")


def _looping_prompts() -> list[list[int]]:
    """Prompts repeating a random segment: the tiny model's outputs then hold some ASCII."""
    g = torch.Generator().manual_seed(1)
    segments = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 9, 13, 21)]
    return [seg * reps for seg, reps in zip(segments, (6, 4, 3, 2))]


def test_stop_token_and_stop_string_inside_accepted_drafts(tiny_llama):
    """With a draft equal to the target every step emits its 4 accepted drafts and the
    target's token, so a stop inside a step's run ends the output where plain decoding does."""
    llm = _draft(tiny_llama, tiny_llama, k=4)
    off = LLM(str(tiny_llama), device="cpu")
    prompts = _looping_prompts()
    plain = [o.token_ids for o in off.generate(prompts, GREEDY)]
    i, index, char = _stop_at(llm, plain)  # steps emit output indices 1-5, 6-10, ...
    out, prompt = plain[i], [prompts[i]]
    for stop in ({"stop_token_ids": [out[index]]}, {"stop": [char]}):
        params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, **stop)
        on, plain_out = llm.generate(prompt, params)[0], off.generate(prompt, params)[0]
        assert on.token_ids == plain_out.token_ids == out[: index + 1]
        assert on.text == plain_out.text and on.finish_reason == "stop"
    _assert_all_returned(llm)


def test_adaptive_k_measures_with_the_draft_model(tiny_llama, near_draft, plain):
    llm = _draft(tiny_llama, near_draft, k=None)
    policy = llm.engine.spec.policy
    assert policy is not None  # the start-up measurement ran with the draft model drafting
    outs = llm.generate(_prompts(), GREEDY)
    assert [o.token_ids for o in outs] == plain
    _assert_all_returned(llm)


def test_the_plan_counts_the_draft_models_weights_and_kv(tiny_llama, small_draft):
    plain_llm = LLM(str(tiny_llama), device="cpu", num_kv_blocks=20)
    llm = _draft(tiny_llama, small_draft, num_kv_blocks=20)
    plan, draft = llm.engine.plan, ModelConfig.from_folder(small_draft)
    assert plan.draft_kv_bytes_per_token == draft.kv_cache_bytes_per_token("float32")
    assert plan.kv_bytes_per_token == plain_llm.engine.plan.kv_bytes_per_token
    per_block = plan.block_size * (plan.kv_bytes_per_token + plan.draft_kv_bytes_per_token)
    assert plan.kv_pool_bytes == 20 * per_block == llm.engine.runner.kv_pool_bytes
    draft_params = sum(p.numel() for p in llm.engine.runner.draft.model.parameters())
    assert plan.draft_weight_bytes == 4 * draft_params
    assert "draft model" in plan.reasons["num_kv_blocks"]
    assert plain_llm.engine.plan.draft_weight_bytes == 0


def test_a_draft_model_that_cannot_serve_the_target_is_refused(tiny_llama, tmp_path):
    other_vocab = tmp_path / "other-vocab"
    config = _smaller(tiny_config("llama"))
    config.vocab_size = VOCAB + 16
    make_tiny_model(config, other_vocab)
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        _draft(tiny_llama, other_vocab)
    with pytest.raises(ValueError, match="draft model .*not found"):
        _draft(tiny_llama, tmp_path / "missing")
    with pytest.raises(ValueError, match="off, ngram or draft:PATH"):
        EngineConfig(speculative="draft:")
    with pytest.raises(ValueError, match="off, ngram or draft:PATH"):
        EngineConfig(speculative="eagle")
    assert EngineConfig(speculative="draft:/models/x").draft_model == "/models/x"
