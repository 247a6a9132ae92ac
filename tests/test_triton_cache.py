"""Triton's kernel cache on disk under the appliance's cache root (appliance.triton_cache):
the variable is set unless the user set it, an unwritable folder is refused naming the
variables to set, and a second process compiles nothing, with the venv's Triton and with the
H200's 3.6, even when the variable is set after Triton is imported."""

from __future__ import annotations

import textwrap

import pytest

from appliance.triton_cache import TRITON_CACHE_ENV, triton_cache_env
from tests.support.triton_versions import each_triton, run_under_triton


def test_the_cache_goes_under_the_appliance_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLIANCE_CACHE_DIR", str(tmp_path / "app"))
    env: dict[str, str] = {}
    assert triton_cache_env(env) == tmp_path / "app" / "triton"
    assert env == {TRITON_CACHE_ENV: str(tmp_path / "app" / "triton")}
    assert (tmp_path / "app" / "triton").is_dir()


def test_a_cache_the_user_set_is_kept(tmp_path):
    env = {TRITON_CACHE_ENV: str(tmp_path / "mine")}
    assert triton_cache_env(env) == tmp_path / "mine"
    assert env == {TRITON_CACHE_ENV: str(tmp_path / "mine")} and (tmp_path / "mine").is_dir()


def test_an_unwritable_cache_names_the_variables_to_set(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("APPLIANCE_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="set APPLIANCE_CACHE_DIR or TRITON_CACHE_DIR to a"):
        triton_cache_env({})
    with pytest.raises(ValueError, match=r"\(Not a directory\): set TRITON_CACHE_DIR to a"):
        triton_cache_env({TRITON_CACHE_ENV: str(tmp_path / "file" / "triton")})


SCRIPT = """
import os
os.environ.pop("TRITON_INTERPRET", None)
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from appliance.triton_cache import triton_cache_env
from engine.runner import compile_count

assert compile_count.install(), triton.__version__
folder = triton_cache_env()  # after Triton's import: it reads the variable at each compile

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

src = ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                constexprs={"BLOCK": 64})
triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
print(triton.__version__, folder, compile_count.total(), compile_count.counter.disk_cache_hits)
"""


@each_triton
def test_a_second_start_compiles_nothing(triton_dir, tmp_path):
    pytest.importorskip("triton")
    env = {"APPLIANCE_CACHE_DIR": str(tmp_path / "app")}
    env["HOME"] = str(tmp_path / "home")  # Triton's own default would be under it
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(SCRIPT))
    counts = []
    for _ in range(2):
        run = run_under_triton(triton_dir, [str(script)], env=env, drop=(TRITON_CACHE_ENV,))
        version, folder, total, hits = run.stdout.split()
        assert folder == str(tmp_path / "app" / "triton")
        counts.append((int(total), int(hits)))
    assert counts == [(1, 0), (1, 1)]  # the second process found the kernel on disk
    assert any((tmp_path / "app" / "triton").rglob("*.cubin"))
    assert not (tmp_path / "home" / ".triton" / "cache").exists()
    if triton_dir is not None:
        assert version.startswith("3.6"), version
