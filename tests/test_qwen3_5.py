"""Qwen3.5 end to end on the CPU: greedy tokens agree with transformers' Qwen3_5ForCausalLM with
the same tiny random fp32 weights (short and long prompts, chunked prefill carrying the linear
layers' state across chunks, a tight KV pool forcing preemption, prefills beside decodes), state
slots held by running requests only and all free at the end, the multimodal checkpoint's text
part, and bad checkpoints refused."""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine import LLM, SamplingParams
from engine.memory.state_pool import SlotAllocator
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.request import Request
from tests.support.greedy_reference import assert_greedy_agrees, generate_under_pressure
from tests.support.tiny_models import EOS_ID, VOCAB, make_tiny_model
from tests.test_qwen3_5_config import tiny_text_config

PROMPT_LENS = [1, 2, 17, 150]
"""Shorter than the conv's 3 remembered inputs, under one chunk of the delta rule (64), three."""
NEW_TOKENS = 8
GREEDY = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True, logprobs=0)


def _prompts(lens=PROMPT_LENS, seed=2) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=g).tolist() for n in lens]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """4 layers: linear, linear, linear, full (the default interval of 4), 2 key heads
    serving 4 value heads."""
    config = tiny_text_config(vocab_size=VOCAB, eos_token_id=EOS_ID, max_position_embeddings=1024)
    folder = make_tiny_model(config, tmp_path_factory.mktemp("qwen3_5"))
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def _llm(folder, **kwargs) -> LLM:
    return LLM(str(folder), device="cpu", max_model_len=256, **kwargs)


def _assert_slots_free(llm: LLM) -> None:
    slots = llm.engine.block_manager.slots
    assert slots is not None and slots.num_free == slots.num_slots


def test_greedy_agrees_short_and_long_prompts(tiny):
    folder, hf = tiny
    llm = _llm(folder)
    assert llm.engine.block_manager.caching is False  # the state needs every token
    assert llm.engine.runner.state_pool.num_slots == llm.engine.config.max_num_seqs
    outs = llm.generate(_prompts(), GREEDY)
    assert_greedy_agrees(hf, _prompts(), outs, logprob_atol=1e-4)
    _assert_slots_free(llm)


def test_speculative_decoding_is_off_for_a_model_with_linear_layers(tiny, caplog):
    folder, hf = tiny
    with caplog.at_level("INFO", logger="engine.spec.step"):
        llm = _llm(folder, speculative="ngram", num_speculative_tokens=4)
    assert llm.engine.spec is None
    assert "speculative decoding is off" in caplog.text
    prompts = [p * 3 for p in _prompts([5, 9])]  # repeats the drafter would have matched
    assert_greedy_agrees(hf, prompts, llm.generate(prompts, GREEDY))


def test_chunked_prefill_carries_the_state_across_chunks(tiny):
    folder, hf = tiny
    prompts = _prompts([5, 70, 150])
    llm = _llm(folder, max_num_batched_tokens=24, max_num_seqs=3)
    outs = llm.generate(prompts, GREEDY)
    assert max(o.metrics.num_prefill_chunks for o in outs) >= 6  # 150 tokens by 24 or fewer
    assert_greedy_agrees(hf, prompts, outs, logprob_atol=1e-4)
    _assert_slots_free(llm)


def test_tight_kv_pool_preempts_and_recomputes_from_a_fresh_state(tiny):
    folder, hf = tiny
    prompts = _prompts([30, 40, 50])
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=0)
    # 3 prompts of up to 62 tokens in 16-token blocks need up to 11 blocks; 6 preempt
    outs = generate_under_pressure(
        folder, hf, prompts, params, num_kv_blocks=6, step_tokens=32, max_model_len=96
    )
    assert all(len(o.token_ids) == 12 for o in outs)


def test_prefills_beside_decodes_and_an_abort(tiny):
    """Requests arrive while others decode, so steps mix decodes with prefill chunks; an
    aborted request gives its slot back and a later one reuses it from a fresh state."""
    folder, hf = tiny
    llm = _llm(folder, max_num_batched_tokens=40, max_num_seqs=3)
    engine, prompts = llm.engine, _prompts([3, 33, 90, 7])
    batches, schedule = [], engine.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        slots = [r.state_slot for r in batch.requests]
        assert None not in slots and len(set(slots)) == len(slots)  # one slot each
        batches.append((batch.num_decodes, len(batch.requests)))
        return batch

    engine.scheduler.schedule = recording_schedule
    engine.add_request("abort-me", _prompts([50], seed=9)[0], GREEDY)
    engine.add_request("0", prompts[0], GREEDY)
    engine.step()
    engine.abort("abort-me")
    done, next_prompt = {}, 1
    while engine.has_unfinished() or next_prompt < len(prompts):
        if next_prompt < len(prompts):
            engine.add_request(str(next_prompt), prompts[next_prompt], GREEDY)
            next_prompt += 1
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    assert any(0 < decodes < n for decodes, n in batches)  # decodes beside prefill chunks
    outs = [done[str(i)] for i in range(len(prompts))]
    assert_greedy_agrees(hf, prompts, outs, logprob_atol=1e-4)
    _assert_slots_free(llm)


def test_scoring_builds_the_state_chunk_by_chunk(tiny):
    """Teacher-forced scoring (engine/runner/scoring.py) borrows a state slot: its first chunk
    starts fresh, the later ones continue the state; the NLL equals transformers'."""
    from engine.runner.scoring import sequence_nll

    folder, hf = tiny
    llm = _llm(folder)
    tokens = _prompts([90], seed=5)[0]
    nll, count = sequence_nll(llm.engine, tokens, chunk_size=32)
    with torch.no_grad():
        logits = hf(torch.tensor([tokens])).logits[0, :-1]  # [89, vocab]
    ref = -logits.log_softmax(-1).gather(1, torch.tensor(tokens[1:])[:, None]).sum().item()
    assert count == len(tokens) - 1
    assert nll == pytest.approx(ref, rel=1e-4)
    _assert_slots_free(llm)


def test_block_manager_hands_out_state_slots():
    bm = BlockManager(8, 4, caching=False, slots=SlotAllocator(2))
    reqs = [Request(str(i), [1, 2, 3], GREEDY, seed=0) for i in range(3)]
    assert bm.allocate_with_prefix(reqs[0], [], 3) and bm.allocate_with_prefix(reqs[1], [], 3)
    assert {reqs[0].state_slot, reqs[1].state_slot} == {0, 1}
    free_blocks = bm.num_free_blocks
    assert not bm.allocate_with_prefix(reqs[2], [], 3)  # no slot: nothing taken
    assert reqs[2].state_slot is None and bm.num_free_blocks == free_blocks
    bm.free(reqs[0])
    assert reqs[0].state_slot is None and bm.slots.num_free == 1
    assert bm.allocate_with_prefix(reqs[2], [], 3) and reqs[2].state_slot is not None
    with pytest.raises(ValueError, match="without prefix caching"):
        bm.set_caching(True)
    with pytest.raises(ValueError, match="without prefix caching"):
        BlockManager(8, 4, caching=True, slots=SlotAllocator(2))


def test_multimodal_checkpoint_runs_its_text_part(tiny, tmp_path, caplog):
    """A Qwen3_5ForConditionalGeneration folder whose config has no vision_config: text weights
    under model.language_model., the vision tower's and the MTP head's skipped with one log
    line (tests/test_vision_engine_qwen3_5.py serves one with its vision tower)."""
    folder, hf = tiny
    weights = load_file(folder / "model.safetensors")
    renamed = {
        (k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
        for k, v in weights.items()
    }
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(8, 8)
    renamed["mtp.fc.weight"] = torch.zeros(8, 8)
    save_file(renamed, tmp_path / "model.safetensors")
    text = json.loads((folder / "config.json").read_text())
    raw = {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "text_config": {k: v for k, v in text.items() if k != "architectures"},
        "eos_token_id": EOS_ID,
        "tie_word_embeddings": text["tie_word_embeddings"],
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    with caplog.at_level("INFO", logger="engine.models.qwen3_5"):
        llm = _llm(tmp_path)
    assert "skipped 2 vision tower and multi-token-prediction weights" in caplog.text
    prompts = _prompts([9, 40])
    assert_greedy_agrees(hf, prompts, llm.generate(prompts, GREEDY), logprob_atol=1e-4)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda w: w.pop("model.layers.1.linear_attn.A_log"), "missing weights"),
        (lambda w: w.pop("model.layers.3.self_attn.q_proj.weight"), "missing weights"),
        (
            lambda w: w.update({"model.layers.0.linear_attn.conv1d.bias": torch.zeros(4)}),
            "unexpected weight",
        ),
        (
            lambda w: w.update({"model.layers.0.linear_attn.in_proj_z.weight": torch.zeros(3, 64)}),
            "shape",
        ),
    ],
)
def test_bad_checkpoints_are_refused(tiny, tmp_path, change, message):
    folder, _ = tiny
    weights = load_file(folder / "model.safetensors")
    change(weights)
    _copy_folder(folder, tmp_path, weights)
    with pytest.raises(ValueError, match=message):
        _llm(tmp_path)


_PROJ = (
    *("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    *("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"),
)


@pytest.mark.skipif(
    importlib.util.find_spec("bitsandbytes") is None, reason="bitsandbytes is not installed"
)
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantized_generates_what_its_dequantized_weights_do(tiny, kind, tmp_path):
    """quantization int8 / int4 quantizes the linear layers' projections too (each row on its
    own, so fused or not they quantize alike); the engine then generates exactly what it
    generates in fp32 from the same weights quantized and dequantized."""
    from engine.quant.bnb import code_table, quantize_4bit, quantize_int8
    from engine.quant.modules import QuantLinear
    from engine.quant.reference import dequantize_ref

    folder, _ = tiny
    group = 32  # divides every projection's input width
    tensors = load_file(folder / "model.safetensors")
    for name, w in tensors.items():
        if name.rsplit(".", 2)[-2] not in _PROJ:
            continue  # embeddings, norms, conv taps, A_log, dt_bias: 16-bit
        if kind == "int8":
            tensors[name] = dequantize_ref(*quantize_int8(w), None, 0)
        else:
            q, scales = quantize_4bit(w, group, "nf4")
            tensors[name] = dequantize_ref(q, scales, code_table("nf4"), group)
    _copy_folder(folder, tmp_path, tensors)
    quantized = _llm(folder, quantization=kind, quant_block_size=group)
    model = quantized.engine.runner.model
    linear_attn = model.layers[0].linear_attn
    assert all(
        isinstance(getattr(linear_attn, p), QuantLinear)
        for p in ("in_proj_qkvz", "in_proj_ba", "out_proj")
    )
    prompts = _prompts([5, 70])
    ours = quantized.generate(prompts, GREEDY)
    want = _llm(tmp_path).generate(prompts, GREEDY)
    assert [o.token_ids for o in ours] == [o.token_ids for o in want]


def _copy_folder(folder, dst, tensors: dict) -> None:
    save_file(tensors, dst / "model.safetensors")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (dst / name).write_bytes((folder / name).read_bytes())


@pytest.mark.gpu
@pytest.mark.parametrize("eager", [True, False])
def test_gpu_greedy_agrees_through_the_triton_kernels(tiny, eager):
    """On CUDA the linear layers run engine/kernels/conv1d.py and gdn.py (in decode CUDA graphs
    unless eager, padding rows on state slot -1), fp32, with chunked prefill."""
    folder, hf = tiny
    llm = LLM(
        str(folder),
        device="cuda",
        dtype="float32",
        enforce_eager=eager,
        max_model_len=256,
        max_num_batched_tokens=48,
        max_num_seqs=8,
    )
    outs = llm.generate(_prompts(), GREEDY)
    assert max(o.metrics.num_prefill_chunks for o in outs) > 1
    assert_greedy_agrees(copy.deepcopy(hf).cuda(), _prompts(), outs)
    _assert_slots_free(llm)
