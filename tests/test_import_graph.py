"""The import graph of Quail's packages, read from the source (every import statement, TYPE_CHECKING and
function-level ones included): no plugin imports another, quail-core imports no plugin, and no import circle at all —
not even one closed by an annotation (docs/architecture.md draws the layers)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "packages"
PACKAGES = {"quail-core": "quail", "quail-native": "quail_native", "quail-vllm": "quail_vllm",
            "quail-sglang": "quail_sglang", "quail-ray": "quail_ray"}

def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        source = ROOT / package / "src"
        for path in source.rglob("*.py"):
            parts = path.relative_to(source).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The known modules `module` imports (a name imported from a package counts as its submodule if it is one)."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                package = package[:len(package) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
    return targets


def graph() -> dict[str, set[str]]:
    known = modules()
    return {module: imported(module, path, known) for module, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
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
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(frozenset(component))
    return found


def test_no_import_circle():
    found = circles(graph())
    assert not found, "import circles: " + "; ".join(" ↔ ".join(sorted(circle)) for circle in found)


def test_the_circle_finder_finds_a_circle_and_only_circles():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_plugin_imports_another_and_core_imports_none():
    edges = graph()
    for module, targets in edges.items():
        top = module.split(".")[0]
        others = {t.split(".")[0] for t in targets} - {top, "quail"}
        assert not others, f"{module} imports {sorted(others)}"
