"""The planner with a draft model for speculative decoding (PlanRequest.draft_model): its
weights come off the budget beside the target's, every block also holds its K/V, and
`appliance profile` shows both."""

from __future__ import annotations

from dataclasses import replace

from engine.memory.memory_check import MemoryItems
from engine.planner import PlanRequest, plan
from engine.planner.formulas import weight_bytes
from tests.test_planner import LLAMA3, gpu

# Llama-3.2-1B's shape (same vocabulary as Llama-3-8B): the usual draft for it
DRAFT = replace(
    LLAMA3, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, head_dim=64
)


def test_the_draft_models_weights_and_kv_are_planned():
    device = gpu(80)
    alone = plan(LLAMA3, device)
    p = plan(LLAMA3, device, PlanRequest(draft_model=DRAFT))
    assert p.draft_weight_bytes == weight_bytes(DRAFT, "none", 2, False)
    assert p.draft_kv_bytes_per_token == DRAFT.kv_cache_bytes_per_token("bfloat16")
    assert p.kv_bytes_per_token == alone.kv_bytes_per_token  # the target's alone
    per_block = p.block_size * (p.kv_bytes_per_token + p.draft_kv_bytes_per_token)
    assert p.kv_pool_bytes == p.num_kv_blocks * per_block
    # the same budget, less the draft's weights, in bigger blocks
    room = alone.num_kv_blocks * alone.block_size * alone.kv_bytes_per_token
    expected = (room - p.draft_weight_bytes) // per_block
    assert abs(p.num_kv_blocks - expected) <= 0.01 * expected
    assert "draft model" in p.reasons["num_kv_blocks"]
    items = MemoryItems.from_plan(p)
    assert items.weights == p.weight_bytes + p.draft_weight_bytes
    assert alone.draft_weight_bytes == alone.draft_kv_bytes_per_token == 0


def test_profile_shows_the_draft_rows(capsys):
    from appliance.probe import CpuProbe, Probe
    from appliance.profile_report import print_tables

    device = gpu(80, bandwidth_gbs=4800.0)
    p = plan(LLAMA3, device, PlanRequest(draft_model=DRAFT))
    print_tables("llama-3-8b", LLAMA3, Probe(CpuProbe()), device, p, {}, [])
    out = capsys.readouterr().out
    assert "draft model weights" in out and f"{p.draft_kv_bytes_per_token:,} B" in out
    both = f"({p.kv_bytes_per_token:,} + {p.draft_kv_bytes_per_token:,}) B"
    assert f"{p.num_kv_blocks} blocks x {p.block_size} tokens x {both}" in out
