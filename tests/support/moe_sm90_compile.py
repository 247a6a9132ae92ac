"""Compile the fused MoE kernels (engine/kernels/moe.py, moe_align.py, moe_gemv.py,
moe_route.py) for sm_90 with Triton and its bundled ptxas, no GPU needed: both sorts, both
grouped GEMMs at every tile config the wrapper picks (each activation, with and without biases,
bf16, int8 and int4 weights), the slot sum, the few-token kernels for each weight kind and the
routing kernel. Run as `python -m tests.support.moe_sm90_compile` (tests/test_moe_kernel.py
does, in a fresh process, under the venv's Triton and the H200's 3.6). Prints one line per
variant, then the count."""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from tests.support.sm90_compile import compile_sm90  # noqa: E402

ALIGNED = ("x_ptr", "w_ptr", "h_ptr", "y_ptr", "hidden", "inter")
"""As a launch at the real shapes specializes them (Qwen3-30B-A3B: 2048 and 768)."""


# (config, activation index, biases, weights: 0 bf16, 1 int8, 2 int4) of each GEMM pair built
GEMMS = [
    ("DECODE", 0, False, 0),
    ("DECODE", 0, False, 1),
    ("DECODE", 0, False, 2),
    ("MEDIUM", 1, True, 0),
    ("PREFILL", 2, True, 0),
    ("PREFILL", 0, False, 1),
    ("PREFILL", 0, False, 2),
]
W_TYPES = ("*bf16", "*i8", "*u8")


def _compile(kernel, types: dict, consts: dict, config) -> bytes:
    aligned = tuple(a for a in ALIGNED if a in kernel.arg_names)
    return compile_sm90(kernel, types, consts, config.num_warps, config.num_stages, aligned)


def main() -> None:
    print(f"triton {triton.__version__}")
    from engine.kernels.moe import _down_kernel, _gate_up_kernel, _sum_slots_kernel
    from engine.kernels.moe_align import (
        _align_kernel,
        _count_kernel,
        _layout_kernel,
        _scatter_kernel,
    )
    from engine.kernels.moe_args import DECODE, MEDIUM, PREFILL

    count = 0
    for block_e in (32, 128):
        types = {"ids_ptr": "*i64", "sorted_ptr": "*i32", "tile_expert_ptr": "*i32"}
        types |= {"num_pairs": "i32", "num_tiles": "i32", "num_rows": "i32"}
        consts = dict(BLOCK_M=16, BLOCK_E=block_e, CHUNK=8192 // block_e)
        print(f"ok align {block_e} experts: {len(compile_sm90(_align_kernel, types, consts, 8))}")
        count += 1
    types = {"ids_ptr": "*i64", "counts_ptr": "*i32", "num_pairs": "i32"}
    print(f"ok count: {len(compile_sm90(_count_kernel, types, dict(CHUNK=1024), 4))} bytes")
    types = {"counts_ptr": "*i32", "tile_expert_ptr": "*i32", "num_tiles": "i32"}
    consts = dict(BLOCK_M=64, BLOCK_E=128, CHUNK=64)
    print(f"ok layout: {len(compile_sm90(_layout_kernel, types, consts, 8))} bytes")
    types = {"ids_ptr": "*i64", "cursor_ptr": "*i32", "sorted_ptr": "*i32", "num_pairs": "i32"}
    print(f"ok scatter: {len(compile_sm90(_scatter_kernel, types, dict(CHUNK=1024), 4))} bytes")
    count += 3
    common = {"sorted_ptr": "*i32", "tile_expert_ptr": "*i32", "num_pairs": "i32"}
    common |= {"hidden": "i32", "inter": "i32"}
    configs = {"DECODE": DECODE, "MEDIUM": MEDIUM, "PREFILL": PREFILL}
    for name, activation, bias, wkind in GEMMS:
        config = configs[name]
        blocks = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k)
        gemm = dict(HAS_BIAS=bias, WKIND=wkind, GROUP=64 if wkind == 2 else 1)
        gemm |= dict(DOT_DTYPE=tl.bfloat16, PRECISION="tf32")
        weights = {"w_ptr": W_TYPES[wkind], "b_ptr": "*bf16", "s_ptr": "*fp32"}
        weights["code_ptr"] = "*fp32"
        types = {"x_ptr": "*bf16", "h_ptr": "*bf16", **weights}
        consts = dict(TOPK=8, ACTIVATION=activation, LIMIT=7.0, ALPHA=1.702, **gemm, **blocks)
        cubin = _compile(_gate_up_kernel, types | common, consts, config)
        what = f"{tuple(config)} activation {activation}{' bias' * bias} {W_TYPES[wkind]}"
        print(f"ok gate_up {what}: {len(cubin)} bytes")
        types = {"h_ptr": "*bf16", "weights_ptr": "*fp32", "y_ptr": "*bf16", **weights}
        cubin = _compile(_down_kernel, types | common, gemm | blocks, config)
        print(f"ok down {what}: {len(cubin)} bytes")
        count += 2
    types = {"y_ptr": "*bf16", "out_ptr": "*bf16", "hidden": "i32"}
    cubin = compile_sm90(_sum_slots_kernel, types, dict(TOPK=8, BLOCK=1024), 4)
    print(f"ok sum slots: {len(cubin)} bytes")
    count += 1 + _compile_few_token_kernels()
    print(f"variants: {count}")


def _compile_few_token_kernels() -> int:
    """moe_gemv's two kernels for each weight kind (Qwen3-30B-A3B's top-8, silu) and
    moe_route's kernel for 128 and 32 experts; returns how many were built."""
    from engine.kernels import moe_gemv
    from engine.kernels.moe_route import _route_kernel

    count = 0
    for wkind in (0, 1, 2):
        weights = {"w_ptr": W_TYPES[wkind], "b_ptr": "*bf16", "s_ptr": "*fp32"}
        weights |= {"code_ptr": "*fp32", "ids_ptr": "*i32", "hidden": "i32", "inter": "i32"}
        gemv = dict(HAS_BIAS=wkind == 0, WKIND=wkind, GROUP=64 if wkind == 2 else 1)
        gemv |= dict(W_DTYPE=tl.bfloat16, BLOCK_K=moe_gemv.BLOCK_K, PDL=True)
        types = {"x_ptr": "*bf16", "h_ptr": "*bf16", **weights}
        consts = dict(TOPK=8, ACTIVATION=0, LIMIT=7.0, ALPHA=1.702, **gemv)
        consts["BLOCK_N"] = moe_gemv.GATE_UP_BLOCK_N
        cubin = compile_sm90(moe_gemv._gate_up_pairs_kernel, types, consts, 4, 3, ALIGNED[:3])
        print(f"ok gate_up pairs {W_TYPES[wkind]}: {len(cubin)} bytes")
        types = {"h_ptr": "*bf16", "weights_ptr": "*fp32", "out_ptr": "*bf16", **weights}
        consts = dict(TOPK=8, BLOCK_N=moe_gemv.DOWN_BLOCK_N, **gemv)
        cubin = compile_sm90(moe_gemv._down_sum_kernel, types, consts, 4, 3, ("w_ptr", "h_ptr"))
        print(f"ok down sum {W_TYPES[wkind]}: {len(cubin)} bytes")
        count += 2
    for experts, scale in ((128, False), (32, True)):
        types = {"logits_ptr": "*bf16", "scale_ptr": "*bf16", "weights_ptr": "*fp32"}
        types |= {"ids_ptr": "*i32", "num_experts": "i32"}
        consts = dict(TOPK=8 if experts == 128 else 4, RENORMALIZE=True, HAS_SCALE=scale)
        consts |= dict(BLOCK_E=experts, BLOCK_K=consts["TOPK"], PDL=True)
        print(f"ok route {experts}: {len(compile_sm90(_route_kernel, types, consts, 1))} bytes")
        count += 1
    return count


if __name__ == "__main__":
    main()
