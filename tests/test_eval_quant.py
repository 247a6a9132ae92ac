"""Teacher-forced scoring (engine.runner.scoring) and `appliance eval-quant`: end to end on the
embedded SmolLM2 (real numbers), failed configs, thresholds, the JSON report."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from appliance.cli import main
from appliance.eval_quant import (
    DEFAULT_PROMPTS,
    Options,
    check_thresholds,
    evaluate,
    load_prompts,
    parse_configs,
)
from engine import LLM
from engine.runner.scoring import iter_next_token_logprobs, sequence_nll


def test_scoring_equals_transformers_and_ignores_chunking(tiny_llama):
    ids = torch.randint(0, 256, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    hf = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0, :-1]
    expect = torch.log_softmax(logits.float(), -1)  # [69, vocab]
    llm = LLM(str(tiny_llama), device="cpu", max_model_len=128, num_kv_blocks=16)
    got = torch.cat([lp for _, lp in iter_next_token_logprobs(llm.engine, ids, chunk_size=16)])
    torch.testing.assert_close(got, expect, atol=2e-4, rtol=0)
    nll, n = sequence_nll(llm.engine, ids, chunk_size=1000)
    assert n == 69
    assert nll == pytest.approx(-float(expect.gather(1, torch.tensor(ids[1:])[:, None]).sum()))
    assert llm.engine.block_manager.num_free_blocks == 16  # blocks handed back


def test_parse_configs_and_prompt_files(tmp_path):
    assert parse_configs("w8,w4,kv8,w8kv8") == [
        ("w8", {"quantization": "int8"}),
        ("w4", {"quantization": "int4"}),
        ("kv8", {"kv_cache_dtype": "int8"}),
        ("w8kv8", {"quantization": "int8", "kv_cache_dtype": "int8"}),
    ]
    with pytest.raises(ValueError, match="unknown config 'w16'"):
        parse_configs("w16")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        load_prompts(bad)
    shipped = load_prompts(DEFAULT_PROMPTS)
    cats = {p.category for p in shipped}
    assert {"long context", "arithmetic", "code", "rare words", "chinese"} <= cats
    assert {"japanese", "russian", "arabic", "hindi"} & cats


def test_failed_config_is_reported_not_raised(tiny_llama):
    prompts = load_prompts(DEFAULT_PROMPTS)[:2]
    for p in prompts:
        p.max_tokens = 4
    opts = Options(["The lighthouse keeper trimmed the wick every four hours."])
    configs = [("kv8", {"kv_cache_dtype": "int8"}), ("broken", {"kv_cache_dtype": "int3"})]
    report = evaluate(configs, prompts, opts, model=str(tiny_llama), device="cpu")
    kv8, broken = report["configs"]
    assert kv8["ok"] and 0.0 <= kv8["mean_agreement"] <= 1.0 and kv8["mean_kl"] >= 0.0
    assert not broken["ok"] and "kv_cache_dtype must be one of" in broken["error"]
    assert check_thresholds(report, min_agreement=1.01) == [
        f"kv8: agreement {kv8['mean_agreement']:.3f} < 1.01"
    ]
    assert check_thresholds(report, max_kl=1e9, max_ppl_increase=1e9) == []


def test_eval_quant_on_embedded_model_end_to_end(tmp_path, capsys):
    """Real numbers: SmolLM2 is trained. An int8 KV cache barely moves it, and an impossible
    --min-agreement makes the command fail (exit 1) after writing the report."""
    out = tmp_path / "report.json"
    args = [
        "eval-quant",
        "--device",
        "cpu",
        "--configs",
        "kv8",
        "--limit",
        "2",
        "--max-tokens",
        "8",
        "--max-score-tokens",
        "160",
        "--max-model-len",
        "1024",
        "--out",
        str(out),
        "--min-agreement",
        "1.01",
    ]
    assert main(args) == 1
    report = json.loads(out.read_text())
    printed = capsys.readouterr()
    assert "eval-quant" in printed.out and "kv8" in printed.out
    assert "threshold missed" in printed.err
    assert report["passed"] is False and report["missed"] and report["failed"] == []
    assert len(report["prompts"]) == 2 and report["reference_tokens"] == 159
    base, (kv8,) = report["baseline"], report["configs"]
    assert base["dtype"] == "float32" and 1.5 < base["perplexity"] < 100
    assert kv8["ok"] and kv8["kv_cache_dtype"] == "int8"
    assert len(kv8["first_divergence"]) == 2 and len(kv8["answers"]) == 2
    assert 0.3 <= kv8["mean_agreement"] <= 1.0
    assert 0.0 <= kv8["mean_kl"] < 0.05 and kv8["max_kl"] >= kv8["mean_kl"]
    assert abs(kv8["ppl_increase_pct"]) < 5.0
    assert math.isclose(
        kv8["perplexity"], base["perplexity"] * (1 + kv8["ppl_increase_pct"] / 100), rel_tol=1e-6
    )
    assert kv8["kl_by_position"][0]["start"] == 0


def test_exit_status_for_a_failed_config(monkeypatch, capsys):
    import appliance.eval_quant_cmd as cmd

    fake = {
        "model": "m",
        "prompts": [{"category": "x", "prompt": "p", "max_tokens": 1, "expect": None}],
        "scored_tokens": 10,
        "baseline": {
            "dtype": "float32",
            "perplexity": 2.0,
            "expected_hits": 0,
            "answers": ["a"],
            "seconds": 1.0,
        },
        "configs": [{"name": "w4", "ok": False, "error": "ValueError: no int4 here"}],
    }
    monkeypatch.setattr(cmd, "evaluate", lambda *a, **k: fake)
    assert main(["eval-quant", "--configs", "w4", "--limit", "1"]) == 3
    captured = capsys.readouterr()
    assert "w4 failed: ValueError: no int4 here" in captured.out


BNB_NOISE = """
import logging, sys
if "--debug" in sys.argv:
    logging.basicConfig(level=logging.DEBUG)
if "--verbose" in sys.argv:
    from engine import library_logs
    library_logs.show()
from engine.quant.bnb import bnb_functional
bnb_functional()  # what eval-quant w8/w4 import
logging.getLogger("bitsandbytes.backends.cpu.ops").warning("optional kernels missing")
"""


@pytest.mark.parametrize("flag, shown", [(None, False), ("--verbose", True), ("--debug", True)])
def test_bitsandbytes_warnings_only_under_a_verbose_flag(flag, shown):
    """bitsandbytes warns on import about kernels-community kernels it cannot fetch; a plain run
    shows none of its warnings, eval-quant --verbose (or a debug log) shows them."""
    argv = [sys.executable, "-c", BNB_NOISE, *([flag] if flag else [])]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=True)
    assert ("optional kernels missing" in done.stderr) is shown
    if not shown:
        assert done.stderr == ""
