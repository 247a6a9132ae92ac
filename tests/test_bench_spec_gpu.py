"""benchmarks/bench_spec_gpu.py on a tiny model on the CPU: every part runs, the speculative runs
give the plain run's tokens, and the forced drafter drafts the target's token at its rate."""

from __future__ import annotations

import json
import random

from benchmarks import bench_spec_gpu


class _Req:
    def __init__(self, rid: str, tokens: list[int]) -> None:
        self.request_id, self.token_ids, self.num_pending = rid, tokens, 0


def test_forced_drafter_agrees_with_the_reference_at_its_rate():
    reference = [random.Random(0).randrange(100) for _ in range(4000)]
    drafter = bench_spec_gpu.ForcedDrafter({"r": reference}, rate=0.6, vocab=100)
    agree = total = 0
    for known in range(10, 3900, 8):
        (draft,) = drafter.propose([_Req("r", reference[:known])], 8)
        assert len(draft.token_ids) == 8
        agree += sum(a == b for a, b in zip(draft.token_ids, reference[known : known + 8]))
        total += 8
    assert 0.57 < agree / total < 0.63


def test_a_tiny_run_writes_every_part(tmp_path, monkeypatch):
    argv = ["bench_spec_gpu", "--tiny", "--device", "cpu", "--rates", "0.6", "--ks", "2"]
    argv += ["--max-tokens", "24", "--prompt-tokens", "32", "--concurrent", "4"]
    monkeypatch.setattr("sys.argv", argv + ["--out", str(tmp_path)])
    bench_spec_gpu.main()
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"b=1 k=0", "b=1 k=8", "b=4 k=8"} <= set(results["cost_ms"])
    assert results["forced"]["a=0.6 k=2"]["tok_s"] > 0
    assert results["load"]["identical"] and results["load"]["concurrent"] == 4
