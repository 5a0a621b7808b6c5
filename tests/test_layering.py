"""The packages' import arrows point one way (docs/design.md, "Layering"):
``rpe``, ``data`` <- ``storage`` <- ``models`` <- ``lifecycle`` <- ``reports`` and the entry points.

Every module's imports are read with `ast`, those inside functions too (a function-level import still ties
the two modules together; it only defers the cost): nothing below the run package imports it or the reports,
storage imports no models, and no import circle joins two packages, or two modules at import time."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rpe", "data", "storage", "models", "lifecycle", "reports", "hydra_plugins", "scripts")
ENTRY_POINTS = ("train", "eval", "starting")
BELOW_LIFECYCLE = ("rpe", "data", "storage", "models")


def project_modules(root: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` of every module of `PACKAGES` and the entry points under ``root``."""
    modules = {name: root / f"{name}.py" for name in ENTRY_POINTS if (root / f"{name}.py").is_file()}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports_of(module: str, source: str, is_package: bool) -> list[tuple[str, bool]]:
    """``(imported name, inside a function)`` for each name ``source`` imports, relative imports made absolute;
    ``from a import b`` gives ``a.b`` (``b`` may be a module or a name in ``a``)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, local) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = module.split(".")
                    parts = parts[: len(parts) - child.level + (1 if is_package else 0)]
                    base = ".".join([*parts, *([child.module] if child.module else [])])
                found.extend((f"{base}.{alias.name}" if base else alias.name, local) for alias in child.names)
            visit(child, local)

    visit(ast.parse(source), False)
    return found


def import_graph(root: Path, with_functions: bool) -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` (module level only, or with imports inside functions)."""
    modules = project_modules(root)

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = {resolve(name) for name, local in imports_of(module, path.read_text(), path.name == "__init__.py")
                   if with_functions or not local}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def package_graph(graph: Mapping[str, Iterable[str]]) -> dict[str, set[str]]:
    """The module graph folded into its top-level packages (an entry point is its own package)."""
    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        top = module.split(".")[0]
        folded.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return folded


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each strongly connected set of more than one node (or a node importing
    itself), sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                elif target in on_stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1 or node in graph.get(node, ()):
                    found.append(sorted(members))
    return sorted(found)


@pytest.fixture(scope="module")
def graphs() -> dict[bool, dict[str, set[str]]]:
    """The project's import graph, module level only (False) and with function-level imports (True)."""
    return {with_functions: import_graph(ROOT, with_functions) for with_functions in (False, True)}


def _upward(graph: Mapping[str, Iterable[str]], low: tuple[str, ...], high: tuple[str, ...]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if module.split(".")[0] in low
                  for target in targets if target.split(".")[0] in high)


def test_nothing_below_the_run_package_imports_it_or_the_tables(graphs) -> None:
    graph = graphs[True]
    assert {"lifecycle.job", "reports.collect", "storage.files", "models.training"} <= graph.keys()  # all read
    assert _upward(graph, BELOW_LIFECYCLE, ("lifecycle", "reports", "scripts", *ENTRY_POINTS)) == []
    assert _upward(graph, ("storage",), ("models",)) == []
    assert _upward(graph, ("lifecycle",), ("reports", "scripts", *ENTRY_POINTS)) == []


def test_no_import_circle_between_packages_nor_between_modules_at_import_time(graphs) -> None:
    for with_functions, graph in graphs.items():
        assert cycles(package_graph(graph)) == [], f"with function-level imports: {with_functions}"
    assert cycles(graphs[False]) == []
    # below the run package not even a function-level import closes a circle (models.factory <-> models.swin did)
    lower = {m: {t for t in targets if t.split(".")[0] in BELOW_LIFECYCLE}
             for m, targets in graphs[True].items() if m.split(".")[0] in BELOW_LIFECYCLE}
    assert cycles(lower) == []


def test_the_checks_see_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """The checks above fail where they must: a circle, a function-level upward import, a relative import."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"a"}}) == [["a"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []
    for package in ("models", "lifecycle", "storage"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "models" / "net.py").write_text("def f():\n    from lifecycle import job\n")
    (tmp_path / "lifecycle" / "job.py").write_text("from . import records\nfrom models.net import f\n")
    (tmp_path / "lifecycle" / "records.py").write_text("import storage.files\n")
    (tmp_path / "storage" / "files.py").write_text("")
    graph = import_graph(tmp_path, with_functions=True)
    assert graph["lifecycle.job"] == {"lifecycle.records", "models.net"}
    assert graph["lifecycle.records"] == {"storage.files"}
    assert _upward(graph, BELOW_LIFECYCLE, ("lifecycle",)) == ["models.net -> lifecycle.job"]
    assert cycles(package_graph(graph)) == [["lifecycle", "models"]]
    assert cycles(import_graph(tmp_path, with_functions=False)) == []  # the circle is closed inside a function
