"""Every recipe imports: a recipe that names a module or function the package no longer has fails here, in CI,
not when a user runs it (recipes are scripts; their `main` is not run, only their imports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_every_recipe_imports():
    names = sorted(p.stem for p in RECIPES.glob("*.py"))
    assert "tune_policy" in names and "compare_policies" in names
    # one interpreter for all of them (torch and transformers load once); recipes import each other from recipes/
    code = (
        "import importlib, sys\n"
        f"sys.path.insert(0, {str(RECIPES)!r})\n"
        "failed = []\n"
        f"for name in {names!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as error:\n"
        "        failed.append(f'{name}: {type(error).__name__}: {error}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"recipes that do not import:\n{result.stdout}{result.stderr[-2000:]}"
