"""The Hopper-only kernel variants (inline PTX, programmatic dependent launch) and the batched
dequantization compile for sm_90 with Triton's bundled ptxas, no GPU needed
(tests/support/sm90_compile.py, in a fresh process): a syntax or type error in the PTX text or a GDC
call fails here, in CI, instead of at a GPU machine's start-up timing (engine.timing lets such
errors propagate). Twice: with the venv's Triton, and with the H200's (3.6, which scripts/setup
puts in .venv/triton-3.6): a constraint string built by an expression compiled with 3.9 and
failed on the H200."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]
H200_TRITON = ROOT / ".venv" / "triton-3.6"


@pytest.mark.parametrize("triton_dir", [None, H200_TRITON], ids=["venv", "triton-3.6"])
def test_hopper_kernel_variants_compile_for_sm90(triton_dir):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if triton_dir is not None:
        if not (triton_dir / "triton").is_dir():
            pytest.skip(f"{triton_dir} holds no triton (scripts/setup installs it)")
        env["PYTHONPATH"] = os.pathsep.join([str(triton_dir), str(ROOT)])
    run = subprocess.run(
        [sys.executable, "-m", "tests.support.sm90_compile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    variants = int(run.stdout.split("variants: ")[-1])  # the script's last line
    assert variants > 2 and run.stdout.count("ok ") == variants, run.stdout
    if triton_dir is not None:
        assert f"triton {triton_dir.name.split('-')[1]}" in run.stdout, run.stdout
