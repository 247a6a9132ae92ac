"""Compile the paged-attention kernels with each attention variant (sliding window, soft-cap,
sinks; engine/kernels/attention_variants.py) for sm_90 with Triton and its bundled ptxas, no
GPU needed: decode (one split and split-K with its merge, 16-bit and int8 caches) and prefill
(head_dim 128 and 256), at the launch configs the wrappers try first. Run as
`python -m tests.support.attention_variants_compile` (tests/test_attention_variants_kernels.py
does, in a fresh process, with the venv's Triton and the H200's 3.6). Prints one line per
variant and `variants: N` last; a compiler error ends the run with it."""

from __future__ import annotations

import os

os.environ.pop("TRITON_INTERPRET", None)  # before triton is imported

import triton  # noqa: E402

from tests.support.sm90_compile import compile_sm90  # noqa: E402

FLOATS = ("qk_scale", "softcap")


def _types(kernel, constexprs: dict, pointers: dict[str, str]) -> dict[str, str]:
    """Every non-constexpr argument's type: pointers from `pointers` (else bf16), the two
    float scalars fp32, the rest i32."""
    types = {}
    for name in kernel.arg_names:
        if name in constexprs:
            continue
        if name.endswith("_ptr"):
            types[name] = pointers.get(name, "*bf16")
        else:
            types[name] = "fp32" if name in FLOATS else "i32"
    return types


ALL = dict(WINDOW=True, SOFTCAP=True, SINKS=True)
WINDOW = dict(WINDOW=True, SOFTCAP=False, SINKS=False)
SOFTCAP = dict(WINDOW=False, SOFTCAP=True, SINKS=False)
SINKS = dict(WINDOW=False, SOFTCAP=False, SINKS=True)
# (variant, int8 cache, one split) of decode; (variant, head_dim, int8 cache) of prefill
DECODE = [(ALL, False, True), (ALL, False, False), (ALL, True, False), (SINKS, False, True)]
DECODE += [(SOFTCAP, False, False)]
PREFILL = [(ALL, 128, False), (ALL, 256, False), (ALL, 128, True), (WINDOW, 128, False)]
PREFILL += [(SINKS, 128, False)]


def compile_decode() -> int:
    from engine.kernels.decode_attention import (
        _decode_merge_kernel,
        _decode_split_kernel,
        merge_block,
        tile_configs,
    )

    count = 0
    for flags, int8, direct in DECODE:
        head_dim = 128
        config = tile_configs(head_dim)[0]
        constexprs = dict(
            GROUP=4,
            BLOCK_G=16,
            HEAD_DIM=head_dim,
            BLOCK_D=head_dim,
            BLOCK_SIZE=16,
            BLOCK_N=config["BLOCK_N"],
            DIRECT_OUT=direct,
            DOT_DTYPE=triton.language.bfloat16,
            DOT_PRECISION="tf32",
            KV_INT8=int8,
            **flags,
            PDL=False,
        )
        cache = "*i8" if int8 else "*bf16"
        pointers = dict(
            k_cache_ptr=cache,
            v_cache_ptr=cache,
            block_tables_ptr="*i32",
            seq_lens_ptr="*i32",
            ws_ptr="*bf16" if direct else "*fp32",
            k_scale_ptr="*fp16" if int8 else cache,
            v_scale_ptr="*fp16" if int8 else cache,
        )
        types = _types(_decode_split_kernel, constexprs, pointers)
        warps, stages = config["num_warps"], config["num_stages"]
        cubin = compile_sm90(_decode_split_kernel, types, constexprs, warps, stages)
        print(f"ok decode {flags} int8={int8} one split={direct}: {len(cubin)} bytes")
        count += 1
    for sinks in (False, True):
        constexprs = dict(
            HEAD_DIM=128, BLOCK_D=128, BLOCK_P=merge_block(16), SINKS=sinks, PDL=False
        )
        types = _types(_decode_merge_kernel, constexprs, {"ws_ptr": "*fp32"})
        cubin = compile_sm90(_decode_merge_kernel, types, constexprs, 4)
        print(f"ok decode merge sinks={sinks}: {len(cubin)} bytes")
        count += 1
    return count


def compile_prefill() -> int:
    from engine.kernels.prefill_attention import _prefill_kernel, tile_configs

    count = 0
    for flags, head_dim, int8 in PREFILL:
        block_r, configs = tile_configs(head_dim)
        constexprs = dict(
            GROUP=2,
            TOKENS_PER_TILE=block_r // 2,
            BLOCK_R=block_r,
            HEAD_DIM=head_dim,
            BLOCK_D=head_dim,
            BLOCK_SIZE=16,
            BLOCK_N=configs[0]["BLOCK_N"],
            DOT_DTYPE=triton.language.bfloat16,
            DOT_PRECISION="tf32",
            KV_INT8=int8,
            **flags,
        )
        cache = "*i8" if int8 else "*bf16"
        pointers = dict(
            k_cache_ptr=cache,
            v_cache_ptr=cache,
            block_tables_ptr="*i32",
            query_start_loc_ptr="*i32",
            seq_lens_ptr="*i32",
            k_scale_ptr="*fp16" if int8 else cache,
            v_scale_ptr="*fp16" if int8 else cache,
        )
        types = _types(_prefill_kernel, constexprs, pointers)
        warps, stages = configs[0]["num_warps"], configs[0]["num_stages"]
        cubin = compile_sm90(_prefill_kernel, types, constexprs, warps, stages)
        print(f"ok prefill {flags} head_dim={head_dim} int8={int8}: {len(cubin)} bytes")
        count += 1
    return count


def main() -> None:
    print(f"triton {triton.__version__}")
    print(f"variants: {compile_decode() + compile_prefill()}")


if __name__ == "__main__":
    main()
