"""Start-up choices for the batch-1 quantized GEMV (engine/kernels/wq_splitk.py): per weight
shape, the fastest correct split-K config of CONFIGS, and whether gate_up's fused SiLU epilogue
beats the GEMV then silu_and_mul; timed on the device over the model's own weights, each in a
CUDA graph (engine.timing.fastest_config), before the decode graphs are captured."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.kernels import wq_splitk as sk  # read at call time: tests reload it
from engine.kernels.ptx_decode import table_words
from engine.timing import fastest_config

Layer = tuple  # (qweight, scales, code or None, bias or None, group_size)
_choice: dict[tuple, tuple[int, int, int] | None] = {}
"""(kind, N, K, group, has bias, x dtype, device) -> the fastest config (None: none ran)."""


def layer_key(layer: Layer, dtype: torch.dtype) -> tuple:
    """What a kernel choice depends on: the weight's kind and shape, the group, whether there
    is a bias, x's dtype and the device."""
    q, _, _, bias, group = layer
    return (q.dtype, *q.shape, group, bias is not None, dtype, q.device)


def read_tables(layers: list[Layer], *dtypes: torch.dtype) -> None:
    """Read each int4 layer's table registers (ptx_decode.table_words) in these types now:
    inside a CUDA graph capture they cannot be read (the kernels then fall back to loads)."""
    for layer in layers:
        if layer[2] is not None:
            for dtype in dtypes:
                table_words(layer[2], dtype)


def by_shape(layers: list[Layer], key: Callable[[Layer], tuple]) -> dict[tuple, list[Layer]]:
    """`layers` grouped by key(layer), in first-seen order."""
    groups: dict[tuple, list[Layer]] = {}
    for layer in layers:
        groups.setdefault(key(layer), []).append(layer)
    return groups


def choose_configs(layers: list[Layer], dtype: torch.dtype) -> None:
    """Time each candidate config per weight shape of `layers`, in a CUDA graph over all of
    that shape's weights (as a decode step reads them), and keep the fastest."""
    from engine.models.quant import wq_matmul_ref  # the reference, to reject a wrong config

    for key, same in by_shape(layers, lambda layer: layer_key(layer, dtype)).items():
        if key in _choice:
            continue
        q, s, code, bias, group = same[0]
        x = _probe_x(q, dtype)
        if not sk.supports(q, x, group):
            continue
        read_tables(same, torch.float16, dtype)
        ref = wq_matmul_ref(x, q, s, code, bias, group).float()

        def call(cfg, layer, x=x):
            return sk.wq_gemv(x, *layer, cfg)

        _choice[key] = fastest_config(sk.CONFIGS[_kind(q)], call, same, ref)
    torch.cuda.empty_cache()


def _probe_x(qweight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    k = qweight.shape[1] * (2 if qweight.dtype == torch.uint8 else 1)
    return torch.randn(1, k, dtype=dtype, device=qweight.device)


_silu: dict[tuple, tuple[int, int, int] | None] = {}
"""Gate-and-up shapes -> the wq_gemv_silu config that beat wq_gemv then silu_and_mul (timed),
or None where the two steps were faster."""


def choose_silu(layers: list[Layer], dtype: torch.dtype) -> None:
    """For gate-and-up layers: time the two steps (the chosen split-K config, then
    silu_and_mul) against wq_gemv_silu with that config and with twice its rows (a program
    then covers as many outputs as before), over all of that shape's weights; keep the
    fastest."""
    from engine.kernels.silu_mul import silu_and_mul

    choose_configs(layers, dtype)
    for key, same in by_shape(layers, lambda layer: layer_key(layer, dtype)).items():
        config = _choice.get(key)
        if key in _silu or config is None:
            continue
        x = _probe_x(same[0][0], dtype)

        def two_steps(layer, x=x, config=config):
            return silu_and_mul(sk.wq_gemv(x, *layer, config))

        ref = two_steps(same[0]).float()
        fused = [c for c in (config, (2 * config[0], *config[1:]))
                 if sk.wq_gemv_silu(x, *same[0], c) is not None]  # fmt: skip

        def call(cfg, layer, x=x, two_steps=two_steps):
            return two_steps(layer) if cfg is None else sk.wq_gemv_silu(x, *layer, cfg)

        _silu[key] = fastest_config([None, *fused], call, same, ref)
    torch.cuda.empty_cache()


def silu_config_for(layer: Layer, x: torch.Tensor) -> tuple[int, int, int] | None:
    """The wq_gemv_silu config choose_silu kept for this gate-and-up layer's shape; None where
    the two steps won, nothing was timed, or the kernel does not take this call."""
    if not x.is_cuda or not sk.supports(layer[0], x, layer[4]):
        return None
    return _silu.get(layer_key(layer, x.dtype))


def _kind(qweight: torch.Tensor) -> str:
    return "int4" if qweight.dtype == torch.uint8 else "int8"


def config_for(layer: Layer, x: torch.Tensor) -> tuple[int, int, int] | None:
    """The chosen config for this layer's shape; timed now (on this layer alone) if no choice
    was made before, or the first candidate while a CUDA graph is being captured. None: the
    split-K kernel does not take this call."""
    if not x.is_cuda or not sk.supports(layer[0], x, layer[4]):
        return None
    key = layer_key(layer, x.dtype)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return sk.CONFIGS[_kind(layer[0])][0]
        choose_configs([layer], x.dtype)
    return _choice.get(key)
