"""The source tree's import rules: the test suite never imports scripts/, the tools (scripts/
and benchmarks/) never import tests/, and no tool edits sys.path to find the packages."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def imported_roots(path: Path) -> set[str]:
    """The top-level package of every import in a file, at any depth (function bodies too)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                roots.add(str(node.args[0].value).split(".")[0])
    return roots


def is_sys_path(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    )


def edits_sys_path(path: Path) -> bool:
    """sys.path.insert/append/extend/..., or sys.path assigned to, anywhere in a file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_sys_path(node.func.value):
                return True
        if isinstance(node, ast.Assign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(is_sys_path(t) for t in targets):
                return True
    return False


def test_the_rules_see_what_they_look_for(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import sys\nsys.path.insert(0, '.')\n"
        "def f():\n    from scripts.x import y\n    import tests.support\n"
    )
    assert imported_roots(sample) >= {"scripts", "tests", "sys"} and edits_sys_path(sample)
    sample.write_text("import sys\nsys.path += ['.']\n")
    assert edits_sys_path(sample)
    sample.write_text("import sys\nprint(sys.path)\nfrom benchmarks import floor\n")
    assert "scripts" not in imported_roots(sample) and not edits_sys_path(sample)


def test_tests_never_import_scripts():
    offenders = [p for p in python_files("tests") if "scripts" in imported_roots(p)]
    assert python_files("tests") and offenders == []


def test_scripts_and_benchmarks_never_import_tests():
    files = python_files("scripts") + python_files("benchmarks")
    offenders = [p for p in files if "tests" in imported_roots(p)]
    assert files and offenders == []


def test_scripts_and_benchmarks_leave_sys_path_alone():
    files = python_files("scripts") + python_files("benchmarks")
    offenders = [p for p in files if edits_sys_path(p)]
    assert files and offenders == []
