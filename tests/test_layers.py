"""Imports flow one way through a call: generation -> candidate_generator -> (policies, drafters, feedback, kernels,
rewards, stats, ...); no module below calls back up. Read from the source with `ast` (no import runs)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "hf_metasd"
#: modules above the seam, or the seam itself: they may import `generation` / `candidate_generator`
ABOVE = {"hf_metasd", "hf_metasd.generation", "hf_metasd.cli", "hf_metasd.custom_generate_repo"}


def _imports(path: Path) -> tuple[str, set[str]]:
    """The module's dotted name and the hf_metasd modules it imports (relative imports resolved)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    name = ".".join(parts)
    package = parts if path.name == "__init__.py" else parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return name, {m for m in found if m.startswith("hf_metasd")}


def test_no_module_below_the_seam_imports_generation_or_the_candidate_generator():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name, imported = _imports(path)
        if name in ABOVE or name.startswith("hf_metasd.benchmark"):
            continue
        wrong = {"hf_metasd.generation", "hf_metasd.candidate_generator"} - {name}
        offenders += [f"{name} imports {target}" for target in sorted(wrong & imported)]
    assert offenders == [], offenders


def test_the_candidate_generator_imports_only_what_lies_below_it():
    _, imported = _imports(PACKAGE / "candidate_generator.py")
    assert "hf_metasd.generation" not in imported
    assert {
        "hf_metasd.feedback",
        "hf_metasd.kernels",
        "hf_metasd.feedback.RoundRewards",
        "hf_metasd.settings",
    } <= imported


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name imported from a package counts as that package's module
    when one of that name exists)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name, imported = _imports(path)
        modules[name] = imported
    return {name: {m for m in imported if m in modules and m != name} for name, imported in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_has_no_import_circles():
    """Every import counts, delayed and `TYPE_CHECKING` ones too, except a package's `__init__` re-exporting its own
    modules (the package is the same concept as its modules)."""
    graph = _graph()
    for name in graph:  # an __init__ importing its submodules is the package, not a layer
        graph[name] = {m for m in graph[name] if not m.startswith(name + ".")}
    assert _cycles(graph) == []


def test_no_module_is_over_500_lines():
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 500
    }
    assert long == {}
