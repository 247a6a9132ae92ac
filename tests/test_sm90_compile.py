"""The Hopper-only kernel variants (inline PTX, programmatic dependent launch) compile for
sm_90 with Triton's bundled ptxas, no GPU needed (tests/sm90_compile.py, in a fresh process):
a syntax or type error in the PTX text or a GDC call fails here, in CI, instead of at a GPU
machine's start-up timing, which would quietly skip the config."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_hopper_kernel_variants_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, "-m", "tests.sm90_compile"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    variants = int(run.stdout.split("variants: ")[-1])  # the script's last line
    assert variants > 2 and run.stdout.count("ok ") == variants, run.stdout
