"""The packages' import arrows point one way (docs/design.md, "Layering"):
``rpe``, ``data`` <- ``storage`` <- ``models`` <- ``lifecycle`` <- ``reports`` and the entry points.

Every module's imports are read with `ast`, those inside functions too (a function-level import still ties
the two modules together; it only defers the cost): nothing below the run package imports it or the reports,
storage imports no models, and no import circle joins two packages or two modules, not even through an import inside
a function. The run package keeps no mutable state in its modules or classes (`lifecycle.command` holds a
command's)."""

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


def test_no_import_circle_between_packages_nor_between_modules(graphs) -> None:
    for with_functions, graph in graphs.items():
        assert cycles(package_graph(graph)) == [], f"with function-level imports: {with_functions}"
    # not even a function-level import closes a circle between two modules (models.factory <-> models.swin,
    # lifecycle.cli <-> lifecycle.job, reports.collect <-> reports.findings did)
    assert cycles(graphs[False]) == [] and cycles(graphs[True]) == []


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


MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "clear",
                      "remove", "discard", "__setitem__", "__delitem__"})
MUTABLE_CALLS = frozenset({"list", "dict", "set", "defaultdict", "deque", "OrderedDict", "Counter"})


def _mutable_value(node: ast.AST | None) -> bool:
    if isinstance(node, (ast.List, ast.Dict, ast.Set, ast.ListComp, ast.DictComp, ast.SetComp)):
        return True
    return isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) in MUTABLE_CALLS


def module_state(source: str) -> list[str]:
    """What a module's code changes that outlives a call: ``global`` rebinding, a module-level or class-level
    container mutated anywhere in the module, or a class attribute assigned from a method (``cls.x = ``,
    ``Name.x = ``). Constants (a dict never written to after its definition) are not state."""
    tree = ast.parse(source)
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    containers: set[str] = set()
    for node in tree.body:
        bodies = [node] if not isinstance(node, ast.ClassDef) else node.body
        for item in bodies:
            targets = item.targets if isinstance(item, ast.Assign) else [item.target] if isinstance(
                item, ast.AnnAssign) else []
            if _mutable_value(getattr(item, "value", None)):
                containers |= {t.id for t in targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found += [f"line {node.lineno}: global {', '.join(node.names)}"]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            owner = node.func.value
            name = owner.attr if isinstance(owner, ast.Attribute) and getattr(owner.value, "id", None) in (
                *classes, "cls") else getattr(owner, "id", None)
            if name in containers:
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            for target in node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]:
                base = target.value if isinstance(target, ast.Subscript) else None
                if isinstance(base, ast.Name) and base.id in containers:
                    found.append(f"line {node.lineno}: {ast.unparse(target)} written")
                if isinstance(target, ast.Attribute) and getattr(target.value, "id", None) in (*classes, "cls"):
                    found.append(f"line {node.lineno}: {ast.unparse(target)} assigned")
                if isinstance(node, ast.AugAssign) and isinstance(target, ast.Name) and target.id in containers:
                    found.append(f"line {node.lineno}: {target.id} extended")
    return found


def test_the_run_package_keeps_no_mutable_state_in_its_modules() -> None:
    """Failed jobs, sweep dirs and stop signals belong to one command (`lifecycle.command.Command`), so two commands
    in one process (a notebook, the tests) never see each other's."""
    state = {path.name: found for path in sorted((ROOT / "lifecycle").glob("*.py"))
             if (found := module_state(path.read_text()))}
    assert state == {}


def test_the_state_check_sees_a_mutated_list_a_global_and_a_class_attribute() -> None:
    assert module_state("FAILED = []\ndef f(x):\n    FAILED.append(x)\n") == ["line 3: FAILED.append()"]
    assert module_state("SEEN = {}\ndef f(k):\n    SEEN[k] = 1\n") == ["line 3: SEEN[k] written"]
    assert module_state("N = 0\ndef f():\n    global N\n    N += 1\n") == ["line 3: global N"]
    assert module_state("class S:\n    got = None\n    @classmethod\n    def set(cls, v):\n        cls.got = v\n"
                        ) == ["line 5: cls.got assigned"]
    assert module_state("class S:\n    n = 0\ndef f():\n    S.n += 1\n") == ["line 4: S.n assigned"]
    assert module_state("class S:\n    seen = {}\ndef f(k):\n    S.seen.update(k)\n") == ["line 4: S.seen.update()"]
    assert module_state("CHOICES = {'a': 1}\ndef f(k):\n    return CHOICES.get(k)\n") == []  # a constant
