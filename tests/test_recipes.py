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


def test_bench_goals_reads_the_goal_figures_from_results():
    sys.path.insert(0, str(RECIPES))
    from bench_goals import goals

    def record(method, prompt, task, seconds, split=None):
        return {"method": method, "prompt_id": prompt, "task": task, "seconds": seconds, "time_split": split or {}}

    def speedups(a, b, overall):
        return {"a": {"speedup": a}, "b": {"speedup": b}, "overall": {"speedup": overall}}

    results = {
        "records": [
            record("autoregressive", "p1", "a", 2.0),
            record("autoregressive", "p2", "b", 3.0),
            record("metasd", "p1", "a", 1.0, {"policy": 0.01, "reward": 0.02}),
            record("metasd", "p2", "b", 4.0, {"replay": 0.05}),
        ],
        "summary": {
            "metasd": speedups(2.0, 0.75, 1.0),
            "fixed[x]": speedups(1.6, 1.0, 1.25),
            "fixed[y]": speedups(1.0, 1.5, 1.2),
            "oracle": speedups(1.6, 1.5, 1.55),
        },
    }
    g = goals(results)
    assert g["slowest_prompts"] == [(0.75, "p2"), (2.0, "p1")]
    assert g["best_fixed"] == ("fixed[x]", 1.25) and g["vs_best_fixed"] == 0.8
    assert g["vs_oracle_per_task"] == {"a": (1.25, "fixed[x]"), "b": (0.5, "fixed[y]")}
    assert g["overhead_percent"] == {"policy": 0.2, "reward": 0.4, "kernel_choice": 0.0, "replay": 1.0}
