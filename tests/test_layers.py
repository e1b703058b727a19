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
    assert {"hf_metasd.feedback", "hf_metasd.kernels", "hf_metasd.round_rewards", "hf_metasd.settings"} <= imported
