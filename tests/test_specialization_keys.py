"""No Triton kernel the engine launches is specialised on a value that changes from step to
step (tests/support/specialization_keys.py, in a fresh process without the interpreter): over
steps of 1 to 2,048 tokens, 1 to 33 decodes, short and long contexts, chunk continuations and
mixes, and quantized GEMMs of 1 to 256 rows, each kernel's specialisation key, computed by
Triton's own launch binder on CPU tensors, is the same, but for the constexprs warm-up covers
on purpose. A kernel that specialised a per-step count (an int equal to 1 or divisible by 16)
or a pointer whose 16-byte alignment follows the step would build a new variant while serving
(as the split count, the block-table stride, the prefill metadata views, the positions view and
the GEMMs' row count did). With the venv's Triton and the H200's 3.6."""

from __future__ import annotations

import pytest

from tests.support.triton_versions import each_triton, run_under_triton

pytest.importorskip("triton")
KERNELS = (
    "_decode_split_kernel",
    "_decode_merge_kernel",
    "_prefill_kernel",
    "_store_kv_kernel",
    "_rope_kernel",
    "_rope_store_kernel",
    "_rms_norm_kernel",
    "_silu_mul_kernel",
    "_wq_gemm_kernel",
    "_sum_splits_kernel",
    "_wq_matmul_kernel",
)


@each_triton
def test_no_kernel_is_specialised_on_the_step(triton_dir):
    run = run_under_triton(triton_dir, ["-m", "tests.support.specialization_keys"])
    lines = run.stdout.splitlines()
    varies = [line for line in lines if line.startswith("varies ")]
    assert not varies, "\n".join(varies)
    checked = [line for line in lines if line.startswith("ok ")]
    assert len(checked) == int(lines[-2].removeprefix("kernels: ")), run.stdout
    for kernel in KERNELS:
        assert any(line.startswith(f"ok {kernel}") for line in checked), kernel
    # the check sees a count that is specialised: 1, 16-divisible and neither give 3 keys
    assert lines[-1] == "control: 3", run.stdout
    if triton_dir is not None:
        assert lines[0] == "triton 3.6.0", lines[0]
