"""Start-up timing of the quantized linears' kernels, and what it chose: QuantChoices, one per
engine (the model runner's engine.startup.kernel_choices.KernelChoices holds it).

Per weight shape, on the device, over the model's own weights (as a decode step reads them),
each candidate in a CUDA graph (engine.timing), before the decode graphs are captured:
- the split-K GEMV's config at one row (kernels/wq_gemv.CONFIGS);
- for gate-and-up weights, whether wq_gemv_silu beats the GEMV then silu_and_mul;
- the Triton dequantization pass against dequantize_to, where it gives the same bits;
- per row bucket up to the engine's batch, the decode-batch GEMM's configs against the path
  without it (dispatch.without_gemm).
Each QuantLinear then holds its own QuantKernels (read by engine/quant/dispatch.py); nothing is
timed while a step runs. The shape-keyed dicts let a second call time only new shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from engine import timing
from engine.kernels import triton_available
from engine.quant.dispatch import QuantKernels, without_gemm
from engine.quant.fp8 import can_scaled_mm, fp8_matches
from engine.quant.modules import QuantLinear
from engine.quant.reference import dequantize_to, wq_matmul_ref
from engine.quant.weight_format import QuantizedWeight

log = logging.getLogger(__name__)


@dataclass
class QuantChoices:
    """One engine's timed choices for its quantized linears, per weight shape."""

    gemv: dict[tuple, tuple | None] = field(default_factory=dict)
    """layer_key -> the fastest correct split-K config (None: none ran)."""
    gemv_silu: dict[tuple, tuple | None] = field(default_factory=dict)
    """layer_key of a gate-and-up weight -> the wq_gemv_silu config that beat the two steps,
    or None where the two steps were faster."""
    dequant: dict[tuple, bool] = field(default_factory=dict)
    """dequant_key -> the Triton pass (True) or dequantize_to (False)."""
    gemm: dict[tuple, dict[int, tuple | None]] = field(default_factory=dict)
    """layer_key -> row bucket -> the decode-batch GEMM's config, or None where the path
    without it won."""

    def kernels_for(self, w: QuantizedWeight, dtype: torch.dtype) -> QuantKernels:
        """What a module of this weight runs with `dtype` activations."""
        key = layer_key(w, dtype)
        gemm = {b: c for b, c in self.gemm.get(key, {}).items() if c is not None}
        dequant = self.dequant.get(dequant_key(w, dtype), False)
        return QuantKernels(dtype, self.gemv.get(key), self.gemv_silu.get(key), dequant, gemm)


def layer_key(w: QuantizedWeight, dtype: torch.dtype) -> tuple:
    """What a kernel choice depends on: the weight's kind and shape, the group, whether there
    is a bias, x's dtype and the device."""
    q = w.qweight
    return (q.dtype, *q.shape, w.group_size, w.bias is not None, dtype, q.device)


def dequant_key(w: QuantizedWeight, dtype: torch.dtype) -> tuple:
    """The dequantization's: the weight's kind, shape and group, the output dtype, the device."""
    q = w.qweight
    return (q.dtype, *q.shape, w.group_size, dtype, q.device)


def by_shape(
    weights: list[QuantizedWeight], key: Callable[[QuantizedWeight], tuple]
) -> dict[tuple, list[QuantizedWeight]]:
    """`weights` grouped by key(weight), in first-seen order."""
    groups: dict[tuple, list[QuantizedWeight]] = {}
    for w in weights:
        groups.setdefault(key(w), []).append(w)
    return groups


def choose_quant_linears(
    model: nn.Module,
    choices: QuantChoices,
    dtype: torch.dtype,
    max_rows: int,
    eager: bool = False,
) -> None:
    """Time the kernels for each QuantLinear shape of the model and hand each module its
    QuantKernels (CUDA with Triton; before capturing). max_rows: the most decode rows a step
    runs (the GEMM is timed for batches up to it). eager (no CUDA graphs): the split-K configs
    only. Layouts no kernel reads (zero points, grouped int8) keep the default; fp8 weights get
    the W8A8 path where it serves them and agrees with the weight-only one."""
    named = [(name, m) for name, m in model.named_modules() if isinstance(m, QuantLinear)]
    if not named or not named[0][1].qweight.is_cuda:
        return
    for _, module in named:  # fp8 checkpoints: W8A8 where the device computes in FP8
        w = module.quantized
        if w.kind == "fp8" and can_scaled_mm(w, w.qweight.device):
            module.kernels = QuantKernels(dtype, scaled_mm=fp8_matches(w, dtype))
    named = [(name, m) for name, m in named if m.quantized.is_kernel_layout]
    if named and triton_available():
        tune_quant_linears(named, choices, dtype, max_rows, eager)


def tune_quant_linears(
    named: list[tuple[str, QuantLinear]],
    choices: QuantChoices,
    dtype: torch.dtype,
    max_rows: int,
    eager: bool = False,
) -> None:
    """choose_quant_linears for these (name, module) pairs, on whatever device they are."""
    weights = [m.quantized for _, m in named]
    if not eager:
        choose_dequant(weights, choices, dtype)
        if max_rows > 1:
            choose_gemm(weights, choices, dtype, max_rows)
    choose_gemv(weights, choices, dtype)
    if not eager:
        gate_up = [m.quantized for name, m in named if name.endswith("gate_up_proj")]
        choose_gemv_silu(gate_up, choices, dtype)
    for _, module in named:
        module.kernels = choices.kernels_for(module.quantized, dtype)


def read_tables(weights: list[QuantizedWeight], *dtypes: torch.dtype) -> None:
    """Read each int4 weight's table registers (ptx_decode.table_words) in these types now:
    inside a CUDA graph capture they cannot be read (the kernels then fall back to loads)."""
    from engine.kernels.ptx_decode import table_words

    for w in weights:
        if w.code is not None:
            for dtype in dtypes:
                table_words(w.code, dtype)


def _probe_x(w: QuantizedWeight, dtype: torch.dtype, rows: int = 1) -> torch.Tensor:
    return torch.randn(rows, w.in_features, dtype=dtype, device=w.qweight.device)


def choose_gemv(weights: list[QuantizedWeight], choices: QuantChoices, dtype) -> None:
    """Time each split-K config per weight shape, in a CUDA graph over all of that shape's
    weights, and keep the fastest that matches the reference."""
    from engine.kernels import wq_gemv

    for key, same in by_shape(weights, lambda w: layer_key(w, dtype)).items():
        if key in choices.gemv:
            continue
        x = _probe_x(same[0], dtype)
        if not wq_gemv.supports(same[0].qweight, x, same[0].group_size):
            continue
        read_tables(same, torch.float16, dtype)
        ref = wq_matmul_ref(x, *same[0].kernel_args()).float()

        def call(cfg, w, x=x):
            return wq_gemv.wq_gemv(x, *w.kernel_args(), cfg)

        configs = wq_gemv.CONFIGS[same[0].kind]
        choices.gemv[key] = timing.fastest_config(configs, call, same, ref)
    torch.cuda.empty_cache()


def choose_gemv_silu(weights: list[QuantizedWeight], choices: QuantChoices, dtype) -> None:
    """For gate-and-up weights: time the two steps (the chosen split-K config, then
    silu_and_mul) against wq_gemv_silu with that config and with twice its rows (a program
    then covers as many outputs as before), over all of that shape's weights; keep the
    fastest."""
    from engine.kernels import wq_gemv
    from engine.kernels.silu_mul import silu_and_mul

    choose_gemv(weights, choices, dtype)
    for key, same in by_shape(weights, lambda w: layer_key(w, dtype)).items():
        config = choices.gemv.get(key)
        if key in choices.gemv_silu or config is None:
            continue
        x = _probe_x(same[0], dtype)

        def two_steps(w, x=x, config=config):
            return silu_and_mul(wq_gemv.wq_gemv(x, *w.kernel_args(), config))

        ref = two_steps(same[0]).float()
        args = same[0].kernel_args()
        candidates = (config, (2 * config[0], *config[1:]))
        fused = [c for c in candidates if wq_gemv.wq_gemv_silu(x, *args, c) is not None]

        def call(cfg, w, x=x, two_steps=two_steps):
            return two_steps(w) if cfg is None else wq_gemv.wq_gemv_silu(x, *w.kernel_args(), cfg)

        choices.gemv_silu[key] = timing.fastest_config([None, *fused], call, same, ref)
    torch.cuda.empty_cache()


def choose_dequant(
    weights: list[QuantizedWeight], choices: QuantChoices, dtype, timed: int = 4
) -> None:
    """Per weight shape: keep the Triton pass where it gives dequantize_to's bits (on the first
    512 rows) and is faster over `timed` of that shape's weights, in a CUDA graph; else
    dequantize_to, also where this device cannot run the pass (timing.config_errors) or lacks
    the memory to time it (the plan counts no scratch for the timing)."""
    from engine.kernels import dequant

    for key, same in by_shape(weights, lambda w: dequant_key(w, dtype)).items():
        if key in choices.dequant:
            continue
        choices.dequant[key] = False
        q, s, code, _, group = same[0].kernel_args()
        if not dequant.supports(q, s, group):
            continue
        rows = (q[:512], s[:512], code, group, dtype)  # a few MB at the memory plan's peak
        try:
            if not torch.equal(dequant.dequantize(*rows), dequantize_to(*rows)):
                log.warning("dequant: Triton pass differs from dequantize_to for %s", key)
                continue
            paths = {False: dequantize_to, True: dequant.dequantize}
            seconds = {use: _seconds(fn, same[:timed], dtype) for use, fn in paths.items()}
        except (*timing.config_errors(), torch.cuda.OutOfMemoryError) as e:
            log.warning("dequant: Triton pass not used for %s: %s", key, str(e)[:200])
            continue
        choices.dequant[key] = seconds[True] < seconds[False]
        count = min(timed, len(same))
        log.info(
            "dequant %s: Triton %.1f us, PyTorch %.1f us a weight",
            key,
            seconds[True] * 1e6 / count,
            seconds[False] * 1e6 / count,
        )
    torch.cuda.empty_cache()


def _seconds(dequantize, weights: list[QuantizedWeight], dtype: torch.dtype) -> float:
    def all_weights():
        for w in weights:
            dequantize(w.qweight, w.scales, w.code, w.group_size, dtype)

    return timing.graph_seconds(all_weights)


def choose_gemm(
    weights: list[QuantizedWeight], choices: QuantChoices, dtype, max_rows: int, timed: int = 8
) -> None:
    """Per weight shape and row bucket up to max_rows' (before capture): time each config of
    the decode-batch GEMM and the path without it (dispatch.without_gemm, with the choices made
    so far) at the bucket's rows, each over up to `timed` of that shape's weights in a CUDA
    graph, and keep the fastest that matches the reference (None: the path without it)."""
    from engine.kernels import wq_gemm

    last = wq_gemm.bucket_for(min(max_rows, wq_gemm.MAX_ROWS))
    for bucket in [b for b in wq_gemm.BUCKETS if b <= last]:
        for key, same in by_shape(weights, lambda w: layer_key(w, dtype)).items():
            buckets = choices.gemm.setdefault(key, {})
            if bucket in buckets:
                continue
            w0 = same[0]
            x = _probe_x(w0, dtype, bucket)
            buckets[bucket] = None
            if not wq_gemm.supports(w0.qweight, w0.scales, x, w0.group_size):
                continue
            ref = wq_matmul_ref(x, *w0.kernel_args()).float()
            read_tables(same, torch.float16)  # int4 words' registers, not in a capture
            without = choices.kernels_for(w0, dtype)

            def call(cfg, w, x=x, without=without):
                if cfg is None:
                    return without_gemm(x, w, without)
                return wq_gemm.wq_gemm(x, *w.kernel_args(), cfg)

            configs = wq_gemm.CONFIGS[w0.kind][bucket]
            buckets[bucket] = timing.fastest_config([None, *configs], call, same[:timed], ref)
            log.info(
                "wq_gemm %s %s, %d rows: %s",
                w0.kind,
                (w0.out_features, w0.in_features),
                bucket,
                buckets[bucket] or "the path without the GEMM",
            )
    torch.cuda.empty_cache()
