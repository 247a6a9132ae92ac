"""The Hopper-only kernel variants (inline PTX, programmatic dependent launch) and the batched
dequantization compile for sm_90 with Triton's bundled ptxas, no GPU needed
(tests/support/sm90_compile.py, in a fresh process): a syntax or type error in the PTX text or a GDC
call fails here, in CI, instead of at a GPU machine's start-up timing (engine.timing lets such
errors propagate). Twice: with the venv's Triton, and with the H200's (3.6, which the test
installs on first use, tests/support/triton_versions.py): a constraint string built by an
expression compiled with 3.9 and failed on the H200."""

from __future__ import annotations

import pytest

from tests.support.triton_versions import H200_TRITON_VERSION, each_triton, run_under_triton

pytest.importorskip("triton")


@each_triton
def test_hopper_kernel_variants_compile_for_sm90(triton_dir):
    run = run_under_triton(triton_dir, ["-m", "tests.support.sm90_compile"], timeout=600)
    variants = int(run.stdout.split("variants: ")[-1])  # the script's last line
    assert variants > 2 and run.stdout.count("ok ") == variants, run.stdout
    if triton_dir is not None:
        assert f"triton {H200_TRITON_VERSION}" in run.stdout, run.stdout
