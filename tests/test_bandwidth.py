"""The decode bandwidth meter: its byte count against a hand count of a tiny model, its step
times with and without overlap, and the figure engine stats() report after CPU steps."""

from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from engine.memory.bandwidth import BandwidthMeter

# tests/support/tiny_models.py's llama: hidden 64, intermediate 128, 2 layers, 4 heads and 2 KV
# heads of 16, vocabulary 320, untied embeddings; float32 on the CPU.
# per layer: q, k and v, o, gate up and down, two norms
PER_LAYER = 64 * 64 + 2 * (64 * 32) + 64 * 64 + 3 * (64 * 128) + 2 * 64
TINY_PARAMS = 2 * PER_LAYER + 2 * 320 * 64 + 64  # layers, embedding + LM head, final norm
TINY_WEIGHT_BYTES = 4 * TINY_PARAMS  # 460,032
TINY_KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K and V x layers x KV heads x head_dim x fp32


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def meter(clock: Clock, peak: float | None = 100.0) -> BandwidthMeter:
    return BandwidthMeter(1000, 10, peak, "nominal (test)" if peak else None, 5.0, clock)


@pytest.fixture(scope="module")
def tiny_engine(tiny_llama):
    return LLM(str(tiny_llama), device="cpu").engine


def test_read_bytes_match_a_hand_count_of_the_tiny_model(tiny_engine):
    m = tiny_engine.bandwidth
    assert (m.weight_bytes, m.kv_bytes_per_token) == (TINY_WEIGHT_BYTES, TINY_KV_BYTES_PER_TOKEN)
    assert m.read_bytes([10, 20]) == TINY_WEIGHT_BYTES + 30 * TINY_KV_BYTES_PER_TOKEN


def test_steps_without_overlap_time_from_their_own_start():
    clock = Clock()
    m = meter(clock)
    for _ in range(3):
        key = object()
        m.launched(key, clock.now, [50, 50])  # 1000 + 100 x 10 bytes
        clock.now += 1e-6
        m.completed(key)
        clock.now += 1.0  # idle between steps: not counted
    r = m.report()
    assert r["decode_steps"] == 3 and r["bytes_per_step"] == 2000
    assert r["step_s"] == pytest.approx(1e-6)
    assert r["achieved_gbs"] == pytest.approx(2000 / 1e-6 / 1e9)  # 2 GB/s
    assert r["share_perc"] == pytest.approx(2.0)
    assert r["peak_source"] == "nominal (test)"


def test_overlapped_steps_time_from_the_previous_end_and_prefill_steps_are_left_out():
    clock = Clock()
    m = meter(clock)
    a, b, c = object(), object(), object()
    m.launched(a, 0.0, None)  # a prefill step
    m.launched(b, 0.1, [100])  # queued behind it
    clock.now = 1.0
    m.completed(a)
    m.launched(c, 1.1, [100])
    clock.now = 2.0
    m.completed(b)  # right after a prefill step: left out
    clock.now = 4.0
    m.completed(c)  # 2.0 s: from b's end, not from its own start
    r = m.report()
    assert r["mixed_steps"] == 2 and r["decode_steps"] == 1
    assert r["step_s"] == pytest.approx(2.0)
    assert r["achieved_gbs"] == pytest.approx(2000 / 2.0 / 1e9)


def test_the_window_forgets_old_steps_and_an_unknown_peak_gives_no_share():
    clock = Clock()
    m = meter(clock, peak=None)
    key = object()
    m.launched(key, 0.0, [1])
    clock.now = 0.5
    m.completed(key)
    assert m.report()["achieved_gbs"] is not None and m.report()["share_perc"] is None
    clock.now = 6.0
    r = m.report()
    assert r["decode_steps"] == 0 and r["achieved_gbs"] is None and r["bytes_per_step"] is None


def test_stats_report_the_decode_bandwidth_after_cpu_steps(tiny_engine):
    engine = tiny_engine
    engine.add_request("bw", list(range(1, 9)), SamplingParams(max_tokens=4, temperature=0))
    while engine.has_unfinished():
        engine.step()
    r = engine.stats()["bandwidth"]
    # a prefill step, then decodes over contexts of 9 (left out: right after the prefill), 10
    # and 11 tokens
    assert r["mixed_steps"] == 2 and r["decode_steps"] == 2
    assert r["bytes_per_step"] == TINY_WEIGHT_BYTES + 10.5 * TINY_KV_BYTES_PER_TOKEN
    assert r["achieved_gbs"] > 0 and r["step_s"] > 0
    assert r["peak_gbs"] == 50  # profiles/gpus/cpu.toml
    assert "cpu.toml" in r["peak_source"] and r["peak_source"].startswith("nominal")
    assert r["share_perc"] == pytest.approx(100 * r["achieved_gbs"] / 50)
