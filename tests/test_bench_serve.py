"""benchmarks/bench_serve.py on the CPU: the offline engine and a real `appliance serve` on the
embedded model, tiny sizes; every row present and the served tokens the server's own count."""

from __future__ import annotations

import json

from benchmarks import bench_serve


def test_offline_and_served_on_the_same_prompts(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PYTHONPATH", str(bench_serve.ROOT))
    argv = ["--device", "cpu", "--concurrency", "1,2", "--input-len", "8-24", "--output-len"]
    argv += ["6", "--rounds", "2", "--processes", "2", "--out", str(tmp_path)]
    assert bench_serve.main(argv) == 0
    results = json.loads((tmp_path / "bench_serve.json").read_text())
    assert [r["concurrency"] for r in results["rows"]] == [1, 2]
    assert results["plan_differences"] == {}  # the server planned what the offline engine did
    for row in results["rows"]:
        c, off, srv = row["concurrency"], row["offline"], row["served"]
        expected = c * 2 * 6  # ignore_eos: every request ran to length, on both sides
        assert off["num_output_tokens"] == expected and off["num_requests"] == c * 2
        assert srv["num_ok"] == srv["num_requests"] == c * 2 and srv["errors"] == {}
        assert srv["num_output_tokens"] == srv["server_output_tokens"] == expected
        assert srv["client_processes"] == min(2, c)
        assert srv["server_tok_s"] == srv["out_tok_s"] > 0 and off["out_tok_s"] > 0
        assert row["served_vs_offline"] == srv["out_tok_s"] / off["out_tok_s"]
        assert off["decode_step_p50_s"] > 0 and off["num_decode_steps"] > 0
        assert row["tpot_vs_decode_step"] == srv["tpot_p50_s"] / off["decode_step_p50_s"]
        assert 0 < srv["ttft_p50_s"] and 0 < off["ttft_p50_s"]
        folder = tmp_path / f"served-{c}"
        sent = [len(json.loads(line)["prompt"]) for line in (folder / "prompts.jsonl").open()]
        assert all(8 <= n <= 24 for n in sent)
        served = json.loads((folder / "bench.json").read_text())["requests"]
        assert sorted(r["num_prompt_tokens"] for r in served) == sorted(sent)  # each prompt once
    shown = capsys.readouterr().out
    assert "served vs offline" in shown and "24 / 24" in shown
