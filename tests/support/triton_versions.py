"""Running a script in a fresh process under each Triton the kernels must compile with: the
venv's own (CI's) and the H200 test machine's, 3.6, which scripts/setup installs beside the
venv. The child runs without the CPU interpreter (TRITON_INTERPRET unset)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H200_TRITON = ROOT / ".venv" / "triton-3.6"
each_triton = pytest.mark.parametrize("triton_dir", [None, H200_TRITON], ids=["venv", "triton-3.6"])
"""Parametrize a test over both: its `triton_dir` is None (the venv's) or H200_TRITON."""


def run_under_triton(
    triton_dir: Path | None,
    args: list[str],
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root with `triton_dir`'s Triton first on the path
    (skips when it is not installed), `env` added and `drop` removed from this environment;
    fails the test when the child fails, and returns it."""
    child = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and k not in drop}
    child.update(env or {})
    child["PYTHONPATH"] = os.pathsep.join([str(ROOT), child.get("PYTHONPATH", "")])
    if triton_dir is not None:
        if not (triton_dir / "triton").is_dir():
            pytest.skip(f"{triton_dir} holds no triton (scripts/setup installs it)")
        child["PYTHONPATH"] = os.pathsep.join([str(triton_dir), str(ROOT)])
    run = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=child,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run
