"""What the GPU benchmark measures against: device rates, the floor, targets, the table.

The floor is bytes / bandwidth and FLOPs / matmul rate, both measured in the same run
(measure_hardware); the arithmetic is pure, so CI checks it against the design's worked numbers.
The model (docs/performance.md, "How the GPU figures are measured"):

- Decode is memory-bound. One step reads every weight once plus the KV of every running
  sequence: time >= (weight bytes + sum of contexts x KV bytes/token) / bandwidth. We also take
  the compute bound of the step (2 x params x batch + attention FLOPs) / matmul rate and use the
  larger of the two (both are lower bounds; memory wins for every workload here).
- Prefill is compute-bound: 2 x params x prompt tokens FLOPs, plus causal attention
  (QK^T and PV: 2 x 2 x layers x q_heads x head_dim x n(n+1)/2), over the matmul rate.
- Weight bytes = all parameters x element size, as the design counts them (the published ~266
  tok/s floor of workload B). That floor is slightly loose for untied models: a decode step
  gathers only a few rows of the input embedding table (Llama-3-8B: 6.5% of its bytes).
- Hybrid models (Qwen3.5): only the full-attention layers keep K/V (kv_layers) and do
  softmax attention; each linear-attention layer keeps a fixed state per sequence, which a
  decode step reads and writes back: 2 x state bytes per sequence per sequence and step. The
  linear layers' own FLOPs (about 7 per state element and token: 0.5% of Qwen3.5-27B's
  per-token matmul FLOPs) are left out.
- Mixture of experts: a decode step of B sequences reads the non-expert weights plus at most
  min(num_experts, B x num_experts_per_tok) experts per layer (batch 1: the active
  parameters; engine.planner.formulas.decode_weight_bytes), and every token's FLOPs are those
  of the active parameters (its k experts), in decode and in prefill.

Throughput workloads (A, D) use a simple schedule: every request is prefilled first (the
prefill FLOPs of all prompts), then all decode together, one token per request per step; a
request leaves after its last token. The first output token comes from prefill, so a request
with o output tokens takes o - 1 decode steps. This matches the engine when max_num_seqs >=
the number of requests and the KV pool holds them all (no queueing, no preemption); it ignores
that a real mixed step could hide some decode weight reads under prefill compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from engine.planner.formulas import decode_weight_bytes
from engine.timing import seconds_per_call


@dataclass(frozen=True)
class Hardware:
    """Measured device rates."""

    bandwidth: float
    """Device-memory copy bandwidth, bytes/s (bytes read + written)."""
    matmul_flops: float
    """Dense matmul rate in the benchmark dtype, FLOP/s."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a model the floor needs."""

    num_params: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    weight_bytes_per_elem: int = 2
    kv_bytes_per_elem: int = 2
    active_params: int | None = None
    """Parameters one token's forward reads (with experts: k of them); None: num_params."""
    expert_params: int = 0
    """Every expert's parameters, all MoE layers (part of num_params); 0 for a dense model."""
    num_experts: int = 0
    num_experts_per_tok: int = 0
    kv_token_bytes: int | None = None
    """KV-cache bytes per token where the layers differ (Gemma 4: full layers with their own
    head dim and KV heads, layers reading another's K/V); None: the uniform formula."""
    kv_layers: int | None = None
    """Layers with softmax attention over a KV cache; None: every layer."""
    state_bytes_per_seq: int = 0
    """A sequence's linear-attention state over every linear layer (0: none)."""

    @property
    def attention_layers(self) -> int:
        return self.num_layers if self.kv_layers is None else self.kv_layers

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.weight_bytes_per_elem

    @property
    def flop_params(self) -> int:
        """The parameters each token multiplies with (2 FLOPs each)."""
        return self.num_params if self.active_params is None else self.active_params

    def decode_weight_bytes(self, num_seqs: int) -> int:
        """Weight bytes a decode step of num_seqs sequences reads: all of them for a dense
        model; with experts, only those the batch can route to."""
        experts = self.expert_params * self.weight_bytes_per_elem
        return decode_weight_bytes(
            self.weight_bytes, experts, self.num_experts, self.num_experts_per_tok, num_seqs
        )

    @property
    def kv_bytes_per_token(self) -> int:
        if self.kv_token_bytes is not None:
            return self.kv_token_bytes
        return kv_bytes_per_token(
            self.attention_layers, self.num_kv_heads, self.head_dim, self.kv_bytes_per_elem
        )

    def state_traffic(self, num_seqs: int) -> int:
        """State bytes one decode step of num_seqs sequences reads and writes back."""
        return 2 * num_seqs * self.state_bytes_per_seq

    @classmethod
    def from_model_config(cls, mc, weight_bytes: int = 2, kv_bytes: int = 2) -> ModelShape:
        """From engine.models.model_config.ModelConfig (or anything with the same attributes): the
        state in the recurrent state's fp32 and the conv state in the weights' dtype."""
        from engine.models.linear_attention import RECURRENT_STATE_BYTES

        counts = mc.param_counts()
        return cls(
            counts.total,
            mc.num_layers,
            mc.num_heads,
            mc.num_kv_heads,
            mc.head_dim,
            weight_bytes,
            kv_bytes,
            active_params=counts.active,
            expert_params=counts.experts,
            num_experts=mc.num_experts,
            num_experts_per_tok=mc.num_experts_per_tok,
            kv_token_bytes=mc.kv_bytes_per_token(kv_bytes),
            kv_layers=len(mc.kv_layers()),
            state_bytes_per_seq=mc.state_bytes_per_sequence(RECURRENT_STATE_BYTES, weight_bytes),
        )


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """2 (K and V) x layers x KV heads x head_dim x bytes per element."""
    return 2 * num_layers * num_kv_heads * head_dim * elem_bytes


def attention_flops(shape: ModelShape, num_pairs: int) -> float:
    """QK^T and PV FLOPs over `num_pairs` (query, key) pairs, all layers and query heads."""
    return 4.0 * shape.attention_layers * shape.num_heads * shape.head_dim * num_pairs


def prefill_flops(shape: ModelShape, num_tokens: int) -> float:
    """One prompt of `num_tokens` from scratch: dense layers + causal attention."""
    causal_pairs = num_tokens * (num_tokens + 1) // 2
    return 2.0 * shape.flop_params * num_tokens + attention_flops(shape, causal_pairs)


def ttft_floor_s(shape: ModelShape, hw: Hardware, prompt_len: int) -> float:
    """Compute floor of time to first token for one prompt (workload C)."""
    return prefill_flops(shape, prompt_len) / hw.matmul_flops


def decode_step_floor_s(shape: ModelShape, hw: Hardware, batch: int, context_sum: int) -> float:
    """One decode step of `batch` sequences whose contexts (incl. the new token) sum to this."""
    weights = shape.decode_weight_bytes(batch) + shape.state_traffic(batch)
    mem = (weights + context_sum * shape.kv_bytes_per_token) / hw.bandwidth
    flops = 2.0 * shape.flop_params * batch + attention_flops(shape, context_sum)
    return max(mem, flops / hw.matmul_flops)


def batch1_decode_floor_tok_s(
    shape: ModelShape, hw: Hardware, prompt_len: int, output_len: int
) -> float:
    """Workload B: bandwidth / (weight bytes + average context x KV bytes/token + the state
    read and written); the weight bytes one sequence reads (with experts: the active ones).

    Decode step j (1 .. output_len - 1) attends over prompt_len + j tokens.
    """
    avg_context = prompt_len + output_len / 2
    weights = shape.decode_weight_bytes(1) + shape.state_traffic(1)
    return hw.bandwidth / (weights + avg_context * shape.kv_bytes_per_token)


@dataclass(frozen=True)
class ThroughputFloor:
    prefill_s: float
    decode_s: float
    num_decode_steps: int
    output_tokens: int

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.total_s if self.total_s > 0 else float("inf")


def throughput_floor(
    shape: ModelShape, hw: Hardware, prompt_lens: list[int], output_lens: list[int]
) -> ThroughputFloor:
    """Workloads A and D under the simple schedule of the module docstring."""
    if len(prompt_lens) != len(output_lens) or not prompt_lens:
        raise ValueError("need one output length per prompt, and at least one request")
    prefill_s = sum(prefill_flops(shape, p) for p in prompt_lens) / hw.matmul_flops
    # Requests sorted by their number of decode steps; drop them as they finish.
    reqs = sorted(zip((o - 1 for o in output_lens), prompt_lens, strict=True))
    num_running, prompt_sum = len(reqs), sum(prompt_lens)
    decode_s, nxt, steps = 0.0, 0, max(o for o, _ in reqs)
    for j in range(1, steps + 1):
        while nxt < len(reqs) and reqs[nxt][0] < j:
            num_running -= 1
            prompt_sum -= reqs[nxt][1]
            nxt += 1
        decode_s += decode_step_floor_s(shape, hw, num_running, prompt_sum + j * num_running)
    return ThroughputFloor(prefill_s, decode_s, steps, sum(output_lens))


# --- measuring the device ------------------------------------------------------------------------
def _copy_bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int, iters: int) -> float:
    src = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    seconds = seconds_per_call(lambda: dst.copy_(src), device, iters)
    return 2 * src.numel() * dtype.itemsize / seconds  # each byte is read once, written once


def _matmul_rate(device: torch.device, dtype: torch.dtype, n: int, iters: int) -> float:
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return 2 * n**3 / seconds_per_call(lambda: torch.mm(a, b), device, iters)


def measure_hardware(device: torch.device, dtype: torch.dtype) -> Hardware:
    """Copy bandwidth (2 GiB tensors) and 8192^3 matmul rate on a GPU, after warm-up, timed
    with CUDA events; small sizes and wall-clock time on the CPU."""
    if device.type != "cuda":
        return Hardware(
            _copy_bandwidth(device, dtype, 128 << 20, 5), _matmul_rate(device, dtype, 512, 5)
        )
    hw = Hardware(
        _copy_bandwidth(device, dtype, 2 << 30, 20), _matmul_rate(device, dtype, 8192, 20)
    )
    torch.cuda.empty_cache()
    return hw


# --- targets of the verdict column (docs/performance.md, "Targets", lists them) ---------------
TARGETS = {
    "A": (">= 12,000 out tok/s", lambda achieved, floor: achieved >= 12_000),
    "B": (">= 226 tok/s", lambda achieved, floor: achieved >= 226),
    "C": ("<= 1.3x floor", lambda achieved, floor: achieved <= 1.3 * floor),
    "D": (">= 10,000 out tok/s", lambda achieved, floor: achieved >= 10_000),
    # a family's shape (bench_gpu.FAMILIES): batch-1 decode and workload A against their floors
    "G3-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "G3-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "G4-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "G4-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "Q3MOE-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "Q3MOE-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "G4MOE-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "G4MOE-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "GPTOSS-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "GPTOSS-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "Q35-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "Q35-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
    "Q35MOE-B": (">= 80% of floor", lambda achieved, floor: achieved >= 0.8 * floor),
    "Q35MOE-A": (">= 60% of floor", lambda achieved, floor: achieved >= 0.6 * floor),
}


def verdict(workload: str, achieved: float | None, floor: float | None) -> tuple[str, str]:
    """(target text, "pass" | "FAIL" | "n/a") for workload "A".."D" (C rows are "C-1024") or a
    family's row ("G3-B", "Q3MOE-B")."""
    key = workload if workload in TARGETS else workload.split("-")[0]
    if key not in TARGETS:
        return "", "n/a"
    text, ok = TARGETS[key]
    if achieved is None or floor is None:
        return text, "n/a"
    return text, "pass" if ok(achieved, floor) else "FAIL"


# --- the table -----------------------------------------------------------------------------------
def _num(value: float | None, metric: str) -> str:
    if value is None:
        return ""
    return f"{value:,.1f}" if "ms" in metric else f"{value:,.0f}"


def _vs_floor(row: dict) -> str:
    achieved, floor = row["achieved"], row["floor"]
    if not achieved or not floor:
        return ""
    if not row["metric"].endswith("ms"):  # a rate: higher is better
        return f"{achieved / floor:.0%} of floor"
    return f"{achieved / floor:.2f}x floor"


def _note(detail: dict) -> str:
    if "error" in detail:
        return detail["error"][:120]
    parts = [detail.get("model", "")]
    if "requests" in detail:
        parts.append(
            f"{detail['requests']} req, {detail.get('num_steps', '?')} steps, "
            f"{detail.get('num_preemptions_total', '?')} preempted"
        )
    runs = detail.get("runs") or detail.get("runs_ms")
    if runs:
        parts.append("runs " + " ".join(f"{r:.1f}" for r in runs))
    return "; ".join(p for p in parts if p)


def print_tables(results: dict, console: Console | None = None) -> None:
    """The workload table (achieved, floor, achieved / floor, target) and the comparison."""
    console = console or Console(width=160)
    hw = results.get("hardware") or {}
    rates = (
        f"copy {hw['bandwidth'] / 1e12:.4g} TB/s, {hw['dtype']} matmul "
        f"{hw['matmul_flops'] / 1e12:.4g} TFLOP/s"
        if hw
        else "rates not measured"
    )
    table = Table(title=f"{results.get('device')} ({results.get('mode')}): {rates}")
    for name in ("workload", "metric", "achieved", "floor", "vs floor", "target", "verdict"):
        table.add_column(name, justify="right" if name in ("achieved", "floor") else "left")
    table.add_column("note", overflow="fold")
    for row in results.get("rows", []):
        is_error = "error" in row["detail"]
        table.add_row(
            row["workload"],
            row["metric"],
            _num(row["achieved"], row["metric"]),
            _num(row["floor"], row["metric"]),
            _vs_floor(row),
            row["target"],
            "error" if is_error else row["verdict"],
            _note(row["detail"]),
        )
    console.print(table)
    hf = results.get("compare_hf")
    if hf:
        if "error" in hf:
            console.print(f"transformers comparison failed: {hf['error']}")
            return
        console.print(
            f"reduced workload A ({hf['requests']} requests, prompt U{hf['prompt_range']}, "
            f"{hf['output_len']} output tokens, {hf['model']}): ours "
            f"{hf['ours_tok_s']:,.0f} out tok/s, transformers generate_batch "
            f"{hf['hf_tok_s']:,.0f} out tok/s: {hf['speedup']:.1f}x"
        )
