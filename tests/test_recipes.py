"""Every recipe runs: a recipe that names a module or function the package (or another recipe) no longer has, or
that cannot find the recipes it imports once moved, fails here, in CI, not when a user runs it. Recipes are scripts;
only their `--help` is run, never their work. Every recipe path the docs name exists (or is marked retired)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
GROUPS = {"pools", "benchmarks", "studies"}


def recipe(name: str):
    """The recipe module `recipes.<name>` (e.g. ``"benchmarks.bench_goals"``), imported as recipes import each other."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"recipes.{name}")


def test_every_recipe_runs_its_help_as_a_script_from_its_group_folder(tmp_path):
    paths = sorted(str(p) for p in RECIPES.glob("*/*.py"))
    assert not list(RECIPES.glob("*.py")), "a recipe belongs in a group folder"
    assert {Path(p).parent.name for p in paths} == GROUPS
    # one interpreter for all of them (torch and transformers load once). Each runs as `python recipes/<group>/<name>.py
    # --help` would: its own folder first on sys.path, not the repository root (the working directory is tmp_path),
    # and no recipe imported yet, so that a recipe that does not put the root on sys.path itself fails.
    code = (
        "import contextlib, io, os, runpy, sys\n"
        "base, failed = list(sys.path), []\n"
        f"for path in {paths!r}:\n"
        "    sys.path[:] = [os.path.dirname(path), *base]\n"
        "    for name in [m for m in sys.modules if m == 'recipes' or m.startswith('recipes.')]:\n"
        "        del sys.modules[name]\n"
        "    sys.argv = [path, '--help']\n"
        "    try:\n"
        "        with contextlib.redirect_stdout(io.StringIO()):\n"
        "            runpy.run_path(path, run_name='__main__')\n"
        "    except SystemExit as error:\n"
        "        if error.code not in (0, None):\n"
        "            failed.append(f'{path}: exit {error.code}')\n"
        "    except Exception as error:\n"
        "        failed.append(f'{path}: {type(error).__name__}: {error}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, f"recipes that do not run:\n{result.stdout}{result.stderr[-2000:]}"


def test_every_recipe_path_the_docs_name_exists_or_is_marked_retired():
    sources = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "mkdocs.yml", *RECIPES.rglob("*.md")]
    sources += [*(REPO / "docs").rglob("*.md"), *(REPO / "docs").rglob("*.py"), *(REPO / "hf_metasd").rglob("*.py")]
    sources += [*(REPO / "hf_metasd").rglob("README.md"), *RECIPES.rglob("*.py"), *(REPO / "tests").glob("*.py")]
    missing = []
    for source in sources:
        text = source.read_text()
        for match in re.finditer(r"recipes/([\w/]+)\.py|recipes\.(\w+)\.(\w+)", text):
            name = match[1] or f"{match[2]}/{match[3]}"
            retired = re.match(r"`? \(retired", text[match.end() :])  # "`recipes/x.py` (retired; in git history ..."
            if not (RECIPES / f"{name}.py").is_file() and not retired:
                missing.append(f"{source.relative_to(REPO)}: {match[0]}")
    assert not missing, "recipe paths that do not exist:\n" + "\n".join(missing)


def test_bench_goals_reads_the_goal_figures_from_results():
    goals = recipe("benchmarks.bench_goals").goals

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


def test_bench_goals_arms_reports_each_arm_alone_and_the_methods_rounds():
    arms = recipe("benchmarks.bench_goals").arms

    def record(method, seconds, passes, drafted=(), accepted=(), arms=(), split=None):
        return {
            "method": method,
            "seconds": seconds,
            "target_forwards": passes,
            "drafted": list(drafted),
            "accepted": list(accepted),
            "arms": list(arms),
            "time_split": split or {},
        }

    results = {
        "records": [
            record("autoregressive", 2.0, 20),  # a plain step: 0.1 s
            record("fixed[x]", 1.0, 4, [3, 3, 2, 0], [2, 1, 2, 0], [0] * 4, {"draft": 0.08, "prefill": 0.3}),
            record("fixed[x]", 1.0, 2, [2, 2], [1, 0], [0] * 2, {"draft": 0.02, "prefill": 0.1}),
            record("metasd", 1.0, 5, [3, 0, 1], [3, 0, 0], [0, 2, 1]),
            record("metasd", 1.0, 5, [1], [1], [0]),
        ]
    }
    a = arms(results)
    assert a["plain_step"] == pytest.approx(0.1)
    x = a["alone"]["fixed[x]"]
    # 6 rounds, 12 drafted, 6 accepted; 0.1 s of drafting over 12 tokens = 8.3 ms = 0.0833 plain steps
    assert (x["accepted"], x["drafted"], x["acceptance"]) == (1.0, 2.0, 0.5)
    assert x["c"] == pytest.approx(0.1 / 12 / 0.1) and x["prefill"] == pytest.approx(0.2)
    assert a["rounds"] == {0: 2, 1: 1, 2: 1}


def test_bench_goals_diagnosis_splits_each_ratio_into_passes_and_cost_per_pass():
    diagnose = recipe("benchmarks.bench_goals").diagnose

    def record(method, task, seconds, passes, drafted, split):
        return {
            "method": method,
            "prompt_id": f"{task}/0",
            "task": task,
            "seconds": seconds,
            "target_forwards": passes,
            "drafted": drafted,
            "time_split": split,
        }

    results = {
        "records": [
            record("autoregressive", "a", 4.0, 40, [], {}),
            # metasd: 20 passes of 0.1 s (verify 0.08, draft + catch-up 0.01, policy + replay 0.005, the rest 0.005)
            record(
                "metasd",
                "a",
                2.0,
                20,
                [3] * 10 + [1] * 10,
                {"verify": 1.6, "draft": 0.1, "catch_up": 0.1, "policy": 0.04, "replay": 0.06},
            ),
            # fixed[x]: 25 passes of 0.064 s, every one verified alone (drafted 0)
            record("fixed[x]", "a", 1.6, 25, [0] * 25, {"verify": 1.5, "draft": 0.05}),
        ],
        "summary": {
            "metasd": {"a": {"speedup": 2.0}, "overall": {"speedup": 2.0}},
            "fixed[x]": {"a": {"speedup": 2.5}, "overall": {"speedup": 2.5}},
        },
    }
    d = diagnose(results)
    assert set(d) == {"a", "overall"} and d["a"]["reference"] == d["overall"]["reference"] == "fixed[x]"
    a = d["a"]
    assert a["pass_ratio"] == 25 / 20 and abs(a["cost_ratio"] - (1.6 / 25) / (2.0 / 20)) < 1e-12
    assert abs(a["ratio"] - 1.6 / 2.0) < 1e-12  # the speed ratio, exactly passes x cost per pass
    ms = a["method_ms"]
    assert [round(ms[k], 9) for k in ("verify", "drafting", "metasd", "other", "total")] == [80, 10, 5, 5, 100]
    assert ms["verified"] == 1 + 40 / 20
    assert a["reference_ms"]["verified"] == 1 and round(a["reference_ms"]["other"], 9) == 2


def test_acceptance_matrix_merged_corpus_holds_every_tasks_documents_cut_like_each_corpus(tmp_path):
    import argparse

    import torch

    matrix = recipe("pools.acceptance_matrix")
    MERGED, corpus_drafters, merged_corpus = matrix.MERGED, matrix.corpus_drafters, matrix.merged_corpus

    torch.save({"outputs": [[1, 2, 3, 4], [5, 6]]}, tmp_path / "code.pt")
    torch.save({"outputs": [[7, 8, 9]]}, tmp_path / "qa.pt")
    stores = argparse.Namespace(outputs=tmp_path)
    merged = merged_corpus(stores, ["code", "qa", "rag"])  # no rag store: left out, as corpus_drafters does
    assert merged.name == MERGED
    assert merged.index.documents() == [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    # each task's corpus cut to its first 3 tokens, then merged
    assert merged_corpus(stores, ["code", "qa"], max_tokens=3).index.documents() == [[1, 2, 3], [7, 8, 9]]
    assert [d.name for d in corpus_drafters(stores, ["code", "qa"])] == ["corpus_code", "corpus_qa"]
