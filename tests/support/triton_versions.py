"""Running a script in a fresh process under each Triton the kernels must compile with: the
venv's own (CI's) and the H200 test machine's, 3.6. The tests that need the second install it
on first use into .cache/ (gitignored; never into the user's .venv) and skip, saying why, where
pip cannot fetch it. The child runs without the CPU interpreter (TRITON_INTERPRET unset)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
H200_TRITON_VERSION = "3.6.0"
"""The Triton of the H200 test machine: a construct only a newer one accepts fails in CI."""
H200_TRITON = ROOT / ".cache" / f"test-triton-{H200_TRITON_VERSION}"
"""Where the tests install it (pip --target), once per clone."""
INSTALL_TIMEOUT_S = 600
each_triton = pytest.mark.parametrize("triton_dir", ["venv", "triton-3.6"], indirect=True)
"""Parametrize a test over both: its `triton_dir` fixture (tests/conftest.py) is None (the
venv's Triton) or H200_TRITON, installed on first use."""


def install_h200_triton() -> Path:
    """H200_TRITON, pip-installing the H200's Triton there first where it is missing (into a
    staging folder renamed at the end, so an interrupted install leaves nothing half-made).
    Skips the calling test when pip cannot install it (no registry reachable, say)."""
    if (H200_TRITON / "triton").is_dir():
        return H200_TRITON
    H200_TRITON.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{H200_TRITON.name}.", dir=H200_TRITON.parent))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    pip += ["--retries", "2", "--no-deps", "--target", str(staging)]
    try:
        try:
            run = subprocess.run(
                [*pip, f"triton=={H200_TRITON_VERSION}"],
                capture_output=True,
                text=True,
                timeout=INSTALL_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"pip took over {INSTALL_TIMEOUT_S} s on triton {H200_TRITON_VERSION}")
        if run.returncode != 0:
            said = (run.stderr.strip().splitlines() or ["no output"])[-1]
            pytest.skip(f"pip could not install triton {H200_TRITON_VERSION}: {said}")
        try:
            staging.rename(H200_TRITON)
        except OSError:  # another test run installed it meanwhile
            if not (H200_TRITON / "triton").is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return H200_TRITON


def run_under_triton(
    triton_dir: Path | None,
    args: list[str],
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = (),
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """`python ARGS` from the repository root with `triton_dir`'s Triton first on the path
    (None: the venv's), `env` added and `drop` removed from this environment; fails the test
    when the child fails, and returns it."""
    child = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and k not in drop}
    child.update(env or {})
    child["PYTHONPATH"] = os.pathsep.join([str(ROOT), child.get("PYTHONPATH", "")])
    if triton_dir is not None:
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
