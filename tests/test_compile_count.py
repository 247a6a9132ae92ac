"""The count of Triton kernel variants built in the process (engine/runner/compile_count.py): the
listener's arithmetic, its chaining, "unknown" without Triton, and the real listener firing
when Triton compiles a kernel for sm_90 with its bundled ptxas (no GPU needed), with the
venv's Triton and with the H200's 3.6."""

from __future__ import annotations

import sys
import textwrap

import pytest

from engine.runner import compile_count
from engine.runner.compile_count import CompileCounter
from tests.support.triton_versions import each_triton, run_under_triton


def test_the_listener_counts_variants_and_calls_the_one_it_replaced():
    seen = []
    counter = CompileCounter()
    counter._previous = lambda **kw: seen.append(kw["cache_hit"])
    counter.on_compile(src=None, metadata={}, metadata_group={}, times=None, cache_hit=False)
    counter.on_compile(src=None, metadata={}, metadata_group={}, times=None, cache_hit=True)
    assert (counter.total, counter.disk_cache_hits) == (2, 1)
    assert seen == [False, True]


def test_the_listener_remembers_which_variant_was_built():
    counter = CompileCounter()
    counter.on_compile(src=None, metadata={"num_warps": 8, "num_stages": 3}, cache_hit=True)
    (variant,) = counter.since(0)
    assert (variant.num_warps, variant.num_stages, variant.cache_hit) == (8, 3, True)
    assert variant.kernel == "?" and variant.describe().endswith("from the disk cache")
    assert counter.since(1) == []


def test_without_triton_the_count_is_unknown(monkeypatch):
    monkeypatch.setattr(compile_count, "_installed", None)
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton now fails
    assert compile_count.install() is False
    assert compile_count.total() is None


def test_installed_on_the_venvs_triton():
    triton = pytest.importorskip("triton")
    if not compile_count.install():
        pytest.skip(f"triton {triton.__version__} has no compilation listener")
    before = compile_count.total()
    triton.knobs.compilation.listener(
        src=None, metadata={}, metadata_group={}, times=None, cache_hit=False
    )
    assert compile_count.total() == before + 1


SCRIPT = """
import os, sys
os.environ.pop("TRITON_INTERPRET", None)
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from engine.runner import compile_count

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

assert compile_count.install(), triton.__version__
def build(block):
    src = ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
                    constexprs={"BLOCK": block})
    triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})
build(64); build(128); build(64)  # two compiles, then the disk cache's copy of the first
c = compile_count.counter
# as the JIT builds a launch with n == 1 and a 16-byte-aligned x: n a constexpr, x_ptr an attr
src = ASTSource(fn=add_one, signature={"x_ptr": "*fp32", "n": "constexpr", "BLOCK": "constexpr"},
                constexprs={"BLOCK": 32, "n": 1}, attrs={(0,): [["tt.divisibility", 16]]})
triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2})
print(c.variants[-1].kernel, "|", c.variants[-1].describe(), file=sys.stderr)
print(triton.__version__, compile_count.total() - 1, c.disk_cache_hits)
"""


@each_triton
def test_the_listener_fires_when_triton_builds_a_kernel(triton_dir, tmp_path):
    pytest.importorskip("triton")
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(SCRIPT))
    empty = {"TRITON_CACHE_DIR": str(tmp_path / "cache")}  # empty: the first builds compile
    run = run_under_triton(triton_dir, [str(script)], env=empty)
    version, total, hits = run.stdout.split()
    assert (int(total), int(hits)) == (3, 1), run.stdout
    kernel, described = run.stderr.strip().splitlines()[-1].split(" | ")
    assert kernel == "add_one"
    assert described.startswith("constexprs BLOCK=32; value 1: n; %16: x_ptr; types x_ptr=*fp32;")
    assert "num_warps=2" in described and described.endswith("compiled"), described
    if triton_dir is not None:
        assert version.startswith("3.6"), version
