"""The import graph of engine/, appliance/, tui/ and scripts/ points one way: no module imports
itself back through others (an import inside a function counts), kernels are leaves,
the dashboard talks to the server and never to the engine, and the engine knows nothing of
the server or the dashboard. Every import statement is read with ast, relative ones resolved.
Every package's modules count, engine's subpackages (scheduling, runner, startup, memory, text,
core, models, planner, quant, spec, structured, kernels) included; and engine's module names
are its own."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "appliance", "tui", "scripts")


def module_files(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Module name -> file, for every .py under the packages (a package is its __init__)."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported_names(name: str, path: Path) -> set[str]:
    """The absolute names every import statement of the module reaches for: `import a.b` gives
    a.b; `from a import b` gives a.b (the caller decides whether that is a module or a name in
    a); relative imports are resolved against the module's package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name lives in: the longest prefix that is one of ours."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    modules = module_files(root, packages)
    graph = {}
    for name, path in modules.items():
        targets = {resolve(n, modules) for n in imported_names(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm,
    iterative), each sorted: every module in one reaches every other through imports."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def describe(cycle: list[str], graph: dict[str, set[str]]) -> str:
    members = set(cycle)
    edges = "; ".join(f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in cycle)
    return f"{', '.join(cycle)} ({edges})"


def violations(root: Path, rule) -> list[str]:
    """'module imports name' for every import some rule(module, name) refuses."""
    found = []
    for name, path in module_files(root, PACKAGES).items():
        for imported in sorted(imported_names(name, path)):
            if rule(name, imported):
                found.append(f"{name} imports {imported}")
    return found


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_import_cycles():
    graph = import_graph(ROOT, PACKAGES)
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(describe(c, graph) for c in cycles)


def test_kernels_import_no_engine_module_above_them():
    def refused(module: str, imported: str) -> bool:
        return (
            _under(module, "engine.kernels")
            and _under(imported, "engine")
            and not (_under(imported, "engine.kernels") or _under(imported, "engine.env"))
        )

    assert not violations(ROOT, refused)


def test_dashboard_never_imports_the_engine():
    def refused(module: str, imported: str) -> bool:
        return _under(module, "tui") and _under(imported, "engine")

    assert not violations(ROOT, refused)


def test_engine_never_imports_the_server_or_the_dashboard():
    def refused(module: str, imported: str) -> bool:
        return _under(module, "engine") and (
            _under(imported, "appliance") or _under(imported, "tui")
        )

    assert not violations(ROOT, refused)


def module_names(root: Path, package: str) -> dict[str, list[str]]:
    """Last name -> the modules and packages under `package` that end in it (no __init__ or
    __main__ files: a package counts by its folder's name)."""
    names: dict[str, list[str]] = {}
    for module in module_files(root, (package,)):
        if module == package or module.endswith(".__main__"):
            continue
        names.setdefault(module.rpartition(".")[2], []).append(module)
    return names


def test_engine_module_names_are_unique():
    """A module's name says what it holds: no two modules or packages under engine/ share a
    name, and none shares one with a module of appliance/ (engine/structured/ and
    the front end's module of structured outputs once did)."""
    engine = module_names(ROOT, "engine")
    appliance = module_names(ROOT, "appliance")
    shared = {name: found for name, found in engine.items() if len(found) > 1}
    shared |= {name: found + appliance[name] for name, found in engine.items() if name in appliance}
    assert not shared, "\n".join(f"{name}: {', '.join(found)}" for name, found in shared.items())


def test_a_lazy_relative_import_that_closes_a_loop_is_a_cycle(tmp_path):
    """The checks above can fail: a function-level relative import back into a module that
    imports it at the top is found, and a one-way pair is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from .a import g\n")
    (pkg / "c.py").write_text("from . import a\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.b"]]
    (pkg / "b.py").write_text("def f():\n    pass\n")
    assert find_cycles(import_graph(tmp_path, ("pkg",))) == []
