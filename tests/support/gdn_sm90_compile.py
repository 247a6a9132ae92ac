"""Compile the Gated DeltaNet kernels (engine/kernels/gdn.py, conv1d.py) for sm_90 with Triton
and its bundled ptxas, no GPU needed, as the wrappers launch them at Qwen3.5's layer shape
(bf16 activations, fp32 state, Dk = Dv = 128, two value heads a key head, conv kernel 4). Run as
`python -m tests.support.gdn_sm90_compile` (tests/test_gdn_kernels.py does, in a fresh process,
under the venv's Triton and the H200's 3.6). Prints one line per variant, then the count."""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

import triton  # noqa: E402

from tests.support.sm90_compile import compile_sm90  # noqa: E402

SHAPE = dict(NUM_V_HEADS=32, GROUP=2, KEY_DIM=128, VALUE_DIM=128, BLOCK_K=128)


def main() -> None:
    print(f"triton {triton.__version__}")
    from engine.kernels.conv1d import BLOCK_C, BLOCK_T, _conv_kernel
    from engine.kernels.gdn import BLOCK_V, _recurrent_kernel

    count = 0
    types = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    types |= {"g_ptr": "*fp32", "beta_ptr": "*fp32", "states_ptr": "*fp32"}
    types |= {"query_start_loc_ptr": "*i32", "slots_ptr": "*i32", "fresh_ptr": "*i1"}
    strides = ("stride_qt", "stride_qh", "stride_kt", "stride_kh", "stride_vt", "stride_vh")
    types |= {name: "i32" for name in (*strides, "stride_gt", "stride_bt")}
    types |= {"scale": "fp32", "eps": "fp32"}
    for block_v in sorted({BLOCK_V, 16, 64}):
        consts = dict(SHAPE, BLOCK_V=block_v, L2NORM=True)
        cubin = compile_sm90(_recurrent_kernel, types, consts, num_warps=4)
        print(f"ok recurrent BLOCK_V {block_v}: {len(cubin)} bytes")
        count += 1
    types = {name: "*bf16" for name in ("x_ptr", "weight_ptr", "bias_ptr", "out_ptr")}
    types |= {"states_ptr": "*bf16", "query_start_loc_ptr": "*i32", "slots_ptr": "*i32"}
    types |= {"fresh_ptr": "*i1", "stride_xt": "i32", "num_channels": "i32"}
    for bias in (False, True):
        consts = dict(KERNEL=4, BLOCK_W=4, HAS_BIAS=bias, SILU=True)
        consts |= dict(BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C)
        cubin = compile_sm90(_conv_kernel, types, consts, num_warps=4)
        print(f"ok conv1d{' bias' * bias}: {len(cubin)} bytes")
        count += 1
    print(f"variants: {count}")


if __name__ == "__main__":
    main()
