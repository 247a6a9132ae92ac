"""The registry swap benchmark on the CPU: its report's arithmetic, the tiny preset folder, and
one swap and one warm restart of a tiny random-weight preset through the server."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import bench_registry_swap as bench
from benchmarks.presets import TINY_DIMS


def test_report_gives_medians_ratio_and_each_phase():
    timings = bench.Timings(
        loaded=[0.01, 0.03, 0.02],
        swapped=[3.0, 5.0, 4.0],
        restarts=[2.0, 4.0],
        swap_startup=[{"load": 1.0, "total": 2.0}, {"load": 3.0, "total": 4.0}],
        restart_startup=[{"load": 1.0, "warm_up": 0.5, "total": 1.5}],
    )
    lines = bench.report(timings, "label")
    assert lines[0] == "label"
    assert "median 4.00 s" in lines[1] and "median 3.00 s" in lines[2]
    assert lines[3] == "ratio swap / warm restart: 1.33 (goal <= 1.2)"
    assert "median 20.0 ms" in lines[4]
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("  ")}
    assert rows == {
        "load": ["2.00", "1.00"],
        "total": ["3.00", "1.50"],
        "warm_up": ["0.00", "0.50"],  # not among the swaps' phases: 0 there
    }
    assert lines[-1].endswith(f"{4.0 - 3.0 - 0.02:.2f} s")


def test_tiny_preset_keeps_the_architecture_with_tiny_layers(tmp_path):
    path = Path(bench.model_path("llama-3-8b", True, tmp_path))
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == TINY_DIMS["hidden_size"]
    assert config["vocab_size"] == 49152  # the embedded tokenizer's, not TINY_DIMS'
    assert (path / "tokenizer.json").is_file()
    assert bench.model_path("llama-3-8b", False, tmp_path) == "llama-3-8b"  # serve resolves it


def test_a_preset_needs_random_weights():
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "llama-3-8b"])


def test_one_swap_and_one_warm_restart_of_a_tiny_preset(capsys):
    argv = ["--preset", "llama-3-8b", "--load-format", "random", "--tiny"]
    bench.main([*argv, "--swaps", "1", "--restarts", "1"])
    lines = capsys.readouterr().out.splitlines()
    swap = float(re.search(r"median (\S+) s", lines[1]).group(1))
    restart = float(re.search(r"median (\S+) s", lines[2]).group(1))
    assert swap > 0 and restart > 0
    ratio = float(re.search(r"restart: (\S+) ", lines[3]).group(1))
    assert ratio == pytest.approx(swap / restart, abs=0.01)
    phases = [line.split()[0] for line in lines if line.startswith("  ")]
    assert "load" in phases and "total" in phases
