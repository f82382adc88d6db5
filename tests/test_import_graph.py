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


def test_first_party_plugins_build_on_quail_and_quail_extend_alone():
    edges = graph()
    for module, targets in edges.items():
        if module.split(".")[0] == "quail":
            continue
        deeper = sorted(t for t in targets if t.split(".")[0] == "quail" and t not in ("quail", "quail.extend"))
        assert not deeper, f"{module} reaches past quail and quail.extend: {deeper}"


LAYERS = (
    ("basics", ("quail.errors", "quail.config", "quail.interrupts", "quail.catalog", "quail.data", "quail.logical",
                "quail.prompts", "quail.datasets", "quail.frontend.spec", "quail.schemas")),
    ("plans", ("quail.physical", "quail.progress")),
    ("contract", ("quail.compute.request", "quail.backends", "quail.backends.base", "quail.backends.shapes")),
    ("planner", ("quail.planner",)),
    ("worker side", ("quail.cache", "quail.serving", "quail.backends.default", "quail.requests", "quail.compute")),
    ("registry", ("quail.plugins",)),
    ("front", ("quail",)),
)
"""quail-core's layers, bottom first (docs/architecture.md draws them): a module imports from its own layer or
below. The front is everything else: SQL and builder front ends, the query run, session, CLI, worker processes,
the test kit and `quail.extend`."""


def layer_of(module: str) -> int:
    """The layer of the longest prefix that names `module` (a module, or a package holding it)."""
    found = [(len(prefix), index) for index, (_, prefixes) in enumerate(LAYERS) for prefix in prefixes
             if module == prefix or module.startswith(prefix + ".")]
    return max(found)[1]


def test_quail_core_imports_point_down_its_layers():
    upward = []
    for module, targets in graph().items():
        if module.split(".")[0] != "quail" or module == "quail.compute.worker":  # a worker process's entry point
            continue
        upward += [f"{module} ({LAYERS[layer_of(module)][0]}) → {target} ({LAYERS[layer_of(target)][0]})"
                   for target in targets if target.split(".")[0] == "quail" and layer_of(target) > layer_of(module)]
    assert not upward, "imports pointing up a layer:\n" + "\n".join(sorted(upward))
