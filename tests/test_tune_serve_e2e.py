"""`appliance tune --serve` end to end on the CPU: tune starts a real `appliance serve` on the
embedded model as a subprocess, searches, soaks, stops it and writes a profile serve can load."""

from __future__ import annotations

import json

from appliance.cli import main
from appliance.settings import load_settings


def test_tune_serves_the_embedded_model_itself(tmp_path, capsys):
    code = main(
        [
            "tune",
            "--serve",
            "embedded",
            "--serve-args",
            "--device cpu --max-model-len 256 --max-num-seqs 4",
            "--slo",
            "ttft=20s,tpot=5s",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--start",
            "1",
            "--max-concurrency",
            "2",
            "--step-duration",
            "1s",
            "--soak",
            "1s",
            "--name",
            "e2e-cpu",
            "--profile-out",
            str(tmp_path),
            "--out",
            str(tmp_path),
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((tmp_path / "tune.json").read_text())
    assert [p["concurrency"] for p in report["probes"]] == [1, 2]
    assert report["best"] == 2 and report["sweep"][0]["point"] == {}
    log = (tmp_path / "servers" / "serve-0.log").read_text()
    assert "serving SmolLM2-135M-Instruct" in log
    settings = load_settings({"profile": str(tmp_path / "e2e-cpu.toml")}, env={})
    assert settings.max_num_seqs == 2 and settings.adaptive_batching is False
