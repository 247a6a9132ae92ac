"""Compile the Hopper-only kernel variants (inline PTX, programmatic dependent launch) and the
batched dequantization for sm_90 with Triton and its bundled ptxas, no GPU needed. Run as
`python -m tests.support.sm90_compile` (tests/test_sm90_compile.py does, in a fresh process:
Triton's interpreter, which the CPU tests switch on, replaces @triton.jit functions at import,
even Triton's own). Prints one line per variant; a compiler error ends the run with it. With
`PYTHONPATH=DIR:.`, the Triton installed in DIR compiles them (tests/test_sm90_compile.py runs
it with the H200's 3.6 too, tests/support/triton_versions.py)."""

from __future__ import annotations

import itertools
import os

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
WQ_TYPES = {
    "x_ptr": "*bf16",
    "w_ptr": "*i32",
    "s_ptr": "*fp32",
    "code_ptr": "*i32",
    "bias_ptr": "*bf16",
    "out_ptr": "*bf16",
    "part_ptr": "*fp32",
    "N": "i32",
    "K": "i32",
    "stride_wn": "i32",
    "stride_sn": "i32",
    "k_per_split": "i32",
}
# (what, is_int4, silu, SPLIT_K, (BLOCK_N, BLOCK_K, num_warps), int4 dot form in bf16 / fp16)
WQ_VARIANTS = [
    ("int8 words", False, False, 1, (8, 1024, 8), None),
    ("int8 words, fused SiLU", False, True, 1, (16, 512, 4), None),
    ("int8 words, split K", False, False, 2, (8, 512, 4), None),
    ("int4 words", True, False, 1, (64, 64, 1), None),
    ("int4 words, fused SiLU", True, True, 1, (16, 64, 2), None),
    ("int4 dot, bf16, split K", True, False, 2, (128, 64, 8), "bf16"),
    ("int4 dot, fp16, fused SiLU", True, True, 1, (64, 64, 4), "f16"),
]


def compile_sm90(
    kernel,
    types: dict[str, str],
    constexprs: dict,
    num_warps: int,
    num_stages: int = 3,
    aligned: tuple[str, ...] = (),
    maxnreg: int | None = None,
) -> bytes:
    """The cubin of `kernel` for sm_90 with these argument types and constexprs; `aligned`
    arguments are taken as multiples of 16 (as Triton specializes a launch whose pointers and
    integers are: the loads then vectorize and pipeline as they will on the device); maxnreg
    caps ptxas' registers a thread."""
    signature = {**types, **{name: "constexpr" for name in constexprs}}
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = dict(
        num_warps=num_warps, num_stages=num_stages, launch_pdl=constexprs.get("PDL", False)
    )
    if maxnreg is not None:
        options["maxnreg"] = maxnreg
    return triton.compile(source, target=SM90, options=options).asm["cubin"]


def main() -> None:
    print(f"triton {triton.__version__}")
    from engine.kernels.gemv import _gemv_kernel, _reduce_kernel
    from engine.kernels.wq_gemv import _wq_gemv_kernel

    for what, is_int4, silu, split, (block_n, block_k, warps), dot in WQ_VARIANTS:
        constexprs = dict(
            IS_INT4=is_int4,
            SPLIT_K=split,
            HAS_BIAS=True,
            BLOCK_N=block_n,
            BLOCK_K=block_k,
            PDL=True,
            WORDS=True,
            SILU=silu,
            DOT=dot is not None,
            BF16=dot == "bf16",
        )
        types = {**WQ_TYPES, "x_ptr": "*i32"} if dot else WQ_TYPES  # x read as pairs
        cubin = compile_sm90(_wq_gemv_kernel, types, constexprs, warps)
        print(f"ok {what}: {len(cubin)} bytes")
    types = {
        "x_ptr": "*bf16",
        "w_ptr": "*bf16",
        "bias_ptr": "*bf16",
        "out_ptr": "*bf16",
        "part_ptr": "*fp32",
        "N": "i32",
        "K": "i32",
        "stride_wn": "i32",
        "k_per_split": "i32",
    }
    consts = dict(SPLIT_K=2, HAS_BIAS=False, BLOCK_N=8, BLOCK_K=512, PDL=True)
    print(f"ok bf16 gemv with PDL: {len(compile_sm90(_gemv_kernel, types, consts, 4))} bytes")
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "N": "i32"}
    consts = dict(SPLIT_K=2, HAS_BIAS=True, BLOCK=1024, PDL=True)
    print(f"ok reduce with PDL: {len(compile_sm90(_reduce_kernel, types, consts, 4))} bytes")
    from engine.kernels.dequant import _dequant_kernel

    for what, q_type, is_int4 in (("int8", "*i8", False), ("int4", "*u8", True)):
        types = {
            "q_ptr": q_type,
            "s_ptr": "*fp32",
            "code_ptr": "*fp32",
            "out_ptr": "*bf16",
            "N": "i32",
            "K": "i32",
            "stride_qn": "i32",
            "stride_sn": "i32",
            "stride_on": "i32",
        }
        consts = dict(GROUP=64, IS_INT4=is_int4, BLOCK_N=16, BLOCK_K=256)
        print(f"ok dequant {what}: {len(compile_sm90(_dequant_kernel, types, consts, 4))} bytes")
    print(f"variants: {len(WQ_VARIANTS) + 4 + compile_wq_gemv_configs() + compile_wq_gemm()}")


def compile_wq_gemv_configs() -> int:
    """Every candidate config of the batch-1 quantized GEMV (wq_gemv.CONFIGS), split K, bf16 x,
    as its launch on CUDA builds it (int4: the decode its second field asks for, the register
    cap its fourth gives): start-up timing skips only a config the device cannot run, so one
    that does not compile would stop the engine; returns how many variants."""
    from engine.kernels.wq_gemv import CONFIGS, _wq_gemv_kernel

    count = 0
    for kind, configs in CONFIGS.items():
        for config in configs:
            is_int4, decode = kind == "int4", config[1]
            words, dot = not is_int4 or decode >= 1, is_int4 and decode == 2
            types = {**WQ_TYPES, "x_ptr": "*i32"} if dot else dict(WQ_TYPES)
            if not words:  # int4 codes as bytes, the fp32 table loaded from L1
                types.update(w_ptr="*u8", code_ptr="*fp32")
            constexprs = dict(
                IS_INT4=is_int4,
                SPLIT_K=2,
                HAS_BIAS=True,
                BLOCK_N=config[0],
                BLOCK_K=64 if is_int4 else config[1],
                PDL=True,
                WORDS=words,
                SILU=False,
                DOT=dot,
                BF16=dot,
            )
            maxnreg = config[3] if len(config) > 3 else None
            cubin = compile_sm90(_wq_gemv_kernel, types, constexprs, config[2], maxnreg=maxnreg)
            print(f"ok wq_gemv {kind} {config}: {len(cubin)} bytes")
            count += 1
    return count


ALIGNED = (
    "x_ptr",
    "w_ptr",
    "s_ptr",
    "code_ptr",
    "bias_ptr",
    "out_ptr",
    "N",
    "K",
    "k_per_split",
    "stride_xm",
    "stride_wn",
)


def compile_wq_gemm() -> int:
    """The decode-batch GEMM (tensor cores), int8 and int4, one pass and split K, in-step and
    loading ahead, at three configs of each row bucket; returns how many variants."""
    from engine.kernels.wq_gemm import CONFIGS, _sum_splits_kernel, _wq_gemm_kernel

    count = 0
    for what, bucket in itertools.product(("int8", "int4"), CONFIGS["int8"]):
        for config in CONFIGS[what][bucket][:2] + CONFIGS[what][bucket][-1:]:
            block_n, block_m, block_k, warps, stages, ahead, *words = config
            words = bool(words and words[0])
            w_type = ("*i32" if words else "*u8") if what == "int4" else "*i8"
            types = {
                "x_ptr": "*bf16",
                "w_ptr": w_type,
                "s_ptr": "*fp32",
                "code_ptr": "*i32" if words else "*fp32",
                "bias_ptr": "*bf16",
                "out_ptr": "*fp32",
                "M": "i32",
                "N": "i32",
                "K": "i32",
                "k_per_split": "i32",
                "stride_xm": "i32",
                "stride_wn": "i32",
                "stride_sn": "i32",
            }
            consts = dict(
                IS_INT4=what == "int4",
                SPLIT_K=1 + (bucket <= 64),
                HAS_BIAS=True,
                BLOCK_N=block_n,
                BLOCK_M=block_m,
                BLOCK_K=64 * block_k if what == "int4" else block_k,
                AHEAD=bool(ahead),
                EVEN_K=True,
                GROUP=64,
                WORDS=words,
            )
            cubin = compile_sm90(_wq_gemm_kernel, types, consts, warps, stages, ALIGNED)
            print(f"ok wq_gemm {what} {config}: {len(cubin)} bytes")
            count += 1
    types = {"part_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16", "MN": "i32", "N": "i32"}
    consts = dict(SPLIT_K=4, HAS_BIAS=True, BLOCK=1024)
    print(f"ok wq_gemm sum: {len(compile_sm90(_sum_splits_kernel, types, consts, 4))} bytes")
    return count + 1


if __name__ == "__main__":
    main()
