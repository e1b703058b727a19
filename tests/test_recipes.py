"""Every recipe runs: a recipe that names a module or function the package (or another recipe) no longer has, or
that cannot find the recipes it imports once moved, fails here, in CI, not when a user runs it. Recipes are scripts;
only their `--help` is run, never their work. Every recipe path the docs name exists (or is marked retired)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"
GROUPS = {"pools", "benchmarks", "studies", "serving"}


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


# ======================================================================================================================
# pools/generate_task_outputs.py
# ======================================================================================================================
def test_generate_task_outputs_answers_the_first_user_turns_of_a_conversation_store(tmp_path, monkeypatch):
    import types

    import pytest
    import torch
    from conftest import greedy, tiny_llama

    tasks = recipe("pools.generate_task_outputs")
    target = tiny_llama(0, layers=2)
    conversations = {
        "prompts": [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10], [20, 21, 22, 23, 24, 25, 26, 27]],
        "outputs": [[11, 12], [13], [28]],
        "answer_spans": [[[3, 5], [6, 8]], [[2, 5]], [[7, 9]]],  # the third's first turn (7 tokens) is too long
    }
    torch.save(conversations, tmp_path / "talk.pt")
    loads = []
    monkeypatch.setattr(
        tasks, "load_models", lambda *a: loads.append(a) or (target, types.SimpleNamespace(eos_token_id=95))
    )
    argv = ["--prompts-store", str(tmp_path / "talk.pt"), "--out", str(tmp_path / "out"), "--max-new-tokens", "6"]
    tasks.main([*argv, "--max-prompt-tokens", "6", "--threads", "1"])
    written = torch.load(tmp_path / "out/talk_own.pt")
    assert written["prompts"] == [[1, 2, 3], [7, 8]] and written["dtype"] == "float32"
    for prompt, output in zip(written["prompts"], written["outputs"], strict=True):
        plain = greedy(target, torch.tensor([prompt]), 6, eos_token_id=95, pad_token_id=95)[0, len(prompt) :].tolist()
        assert output == plain[: plain.index(95) + 1 if 95 in plain else 6]  # the target's own greedy answer

    del conversations["answer_spans"]  # refused by name, before the target loads
    torch.save(conversations, tmp_path / "plain.pt")
    loads.clear()
    with pytest.raises(SystemExit, match=r"`--prompts-store` must hold `answer_spans` \(a store of sharegpt_data.py\), "
                       r"but holds \['outputs', 'prompts'\]\. Pass such a store"):  # fmt: skip
        tasks.main(["--prompts-store", str(tmp_path / "plain.pt"), "--out", str(tmp_path / "out")])
    assert loads == []


# ======================================================================================================================
# studies/head_drafted_positions.py
# ======================================================================================================================
def test_head_drafted_positions_accepts_in_generate_what_the_head_scores_teacher_forced():
    from conftest import prompts, sharpen, tiny_llama
    from test_feature_head_drafter import trained_head

    study = recipe("studies.head_drafted_positions")
    target = sharpen(tiny_llama(0, layers=4))
    head = trained_head(target)
    totals = {}
    for prompt in prompts(3, seed=7):
        for key, value in study.drafted_positions(target, head, prompt[0].tolist(), 12).items():
            totals[key] = totals.get(key, 0) + value
    assert totals["scored"] == 3 * 12 and totals["drafted"] >= 3 * 6  # every round drafts one token
    assert 0 < totals["accepted"] < totals["drafted"]  # some drafts kept, some not: the comparison can fail
    assert totals["agree_at_drafted"] == totals["accepted"] and totals["differ"] == 0  # float32: the same, exactly


# ======================================================================================================================
# pools/train_feature_head.py
# ======================================================================================================================
def _feature_head_stores(folder, target, tasks=("code", "qa"), per_task=10, answer_tokens=24):
    """Task-output stores as generate_task_outputs.py writes them: the tiny target's own greedy answers."""
    import torch
    from conftest import greedy, prompts

    for i, task in enumerate(tasks):
        store = {"prompts": [], "outputs": [], "seconds": 1.0, "dtype": "float32"}
        for prompt in prompts(per_task, seed=100 + i):
            with torch.no_grad():
                out = greedy(target, prompt, answer_tokens)
            store["prompts"].append(prompt[0].tolist())
            store["outputs"].append(out[0, prompt.shape[1] :].tolist())
        torch.save(store, folder / f"{task}.pt")


def test_train_feature_head_unrolled_steps_are_the_heads_cached_drafting_passes():
    import torch
    from conftest import tiny_llama

    from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig

    unrolled_logits = recipe("pools.train_feature_head").unrolled_logits
    target = tiny_llama(0, layers=4)
    torch.manual_seed(0)
    config = FeatureHeadConfig.for_target(target, layer_ids=(1, 4), intermediate_size=48, norm_before_residual=True)
    head = FeatureHead(config, target.get_input_embeddings()).eval()
    with torch.no_grad():  # random norms, so that a norm applied to the wrong tensor shows
        for name, param in head.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    features, ids = torch.randn(2, 9, 2 * 32), torch.randint(96, (2, 9))
    with torch.no_grad():
        steps = unrolled_logits(head, features, ids, 3)
        assert [tuple(s.shape) for s in steps] == [(2, 8, 96), (2, 7, 96), (2, 6, 96)]
        for c in (0, 3, 5):  # commit entries 0 .. c from features, then feed the head's own outputs, as `draft` does
            cache = head.new_cache()
            logits, out = head(head.fuse(features[:, : c + 1]), ids[:, 1 : c + 2], cache)
            torch.testing.assert_close(steps[0][:, c], logits[:, -1], atol=1e-5, rtol=1e-5)
            for step in (1, 2):
                logits, out = head(out[:, -1:], ids[:, c + 1 + step : c + 2 + step], cache)
                torch.testing.assert_close(steps[step][:, c], logits[:, -1], atol=1e-5, rtol=1e-5)


def test_train_feature_head_learns_the_targets_own_answers_and_saves_a_loadable_head(tmp_path):
    import torch
    from conftest import sharpen, tiny_llama

    from hf_metasd.feature_head import FeatureRecorder, load_feature_head

    train = recipe("pools.train_feature_head")
    target = sharpen(tiny_llama(0, layers=4))
    stores = tmp_path / "stores"
    stores.mkdir()
    _feature_head_stores(stores, target)
    argv = ["--stores", str(stores), "--out", str(tmp_path / "head"), "--work-dir", str(tmp_path / "work")]
    argv += ["--layer-ids", "1", "2", "4", "--draft-vocab-size", "64", "--intermediate-size", "64"]
    argv += ["--val-sequences", "2", "--epochs", "10", "--batch-size", "4", "--lr", "1e-2", "--threads", "1"]
    argv += ["--chunk-sequences", "5"]
    record = train.main(argv, target=target)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [
        "features.json", "train-00000.safetensors", "train-00001.safetensors", "train-00002.safetensors",
        "train-00003.safetensors", "val-00000.safetensors",
    ]  # fmt: skip
    assert record["features"]["train"]["answers_match_labels"] == 1.0  # the labels are the stored answers
    last, untrained = record["epochs"][-1], record["untrained"]
    assert last["agreement_step0"] > untrained["agreement_step0"] + 0.2
    assert last["agreement_step1"] > untrained["agreement_step1"] + 0.2
    assert last["val_loss"] < untrained["val_loss"]
    saved = json.loads((tmp_path / "head" / "training_record.json").read_text())
    assert saved["epochs"] == record["epochs"] and saved["args"]["epochs"] == 10
    head = load_feature_head(tmp_path / "head", target)
    assert head.config.layer_ids == (1, 2, 4) and head.config.draft_vocab_size == 64
    prompt = torch.tensor([train.read_stores(stores, ["code"], None, 2)["val"][0][1]])
    with torch.no_grad(), FeatureRecorder(target, head.config.layer_ids) as recorder:
        nxt = target(prompt).logits[:, -1:].argmax(-1)
    tokens, _ = head.draft(recorder.features(), torch.cat([prompt[:, 1:], nxt], 1), 3, cache=head.new_cache())
    assert tokens.shape == (1, 3) and bool(head.in_draft_vocab(tokens).all())
    # a second run with the same settings reuses the cached features
    second = train.main([*argv, "--epochs", "1"], target=target)  # (it saves over the first head)
    assert second["features"] == record["features"]
    # --init-head continues from a saved head (its held-out figures first), --round-bfloat16 stores bfloat16 numbers
    more = [*argv, "--epochs", "1", "--init-head", str(tmp_path / "head"), "--out", str(tmp_path / "more")]
    continued = train.main([*more, "--round-bfloat16"], target=target)
    held_out = {k: v for k, v in second["epochs"][-1].items() if k in continued["untrained"]}
    assert continued["untrained"] == held_out  # the saved head's own figures, not an untrained head's
    assert continued["epochs"][-1]["rounded_to_bfloat16"] is True
    rounded = load_feature_head(tmp_path / "more", target)
    assert torch.equal(rounded.fc.weight, rounded.fc.weight.bfloat16().float())
    assert rounded.config == head.config and torch.equal(rounded.d2t, head.d2t)


def test_train_feature_head_refuses_missing_stores_and_no_training_sequences(tmp_path):
    import torch

    train = recipe("pools.train_feature_head")
    with pytest.raises(SystemExit, match=r"`--stores` must hold <task>.pt files .* but '.*' holds none"):
        train.read_stores(tmp_path, ["code"], None, 2)
    torch.save({"prompts": [[1], [2]], "outputs": [[3], [4]]}, tmp_path / "code.pt")
    with pytest.raises(SystemExit, match=r"`--val-sequences` must leave sequences to train on, but is 2 with stores"):
        train.read_stores(tmp_path, ["code"], None, 2)
    assert len(train.read_stores(tmp_path, ["code"], None, 1)["train"]) == 1


def test_gpu_check_quick_on_cpu_has_a_passing_row_per_kind_and_the_mixed_pool(tmp_path, capsys):
    import json

    from hf_metasd.drafters import DRAFTER_KINDS

    gpu_check = recipe("benchmarks.gpu_check")
    out = tmp_path / "gpu_check.json"
    assert gpu_check.main(["--device", "cpu", "--quick", "--dtypes", "float32", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["kind"] for r in rows] == [*sorted(DRAFTER_KINDS), "mixed/round_robin", "mixed/default"]
    assert {r["lossless"] for r in rows} == {"PASS"} and {r["dtype"] for r in rows} == {"float32"}
    assert all(r["rounds"] > 0 and r["per_round_steps"]["wall"] > 0 for r in rows)
    # policy `fixed`: every kind's arm was asked every round; the model-backed kinds drafted every round
    assert all(r["drafted_per_round"] > 0 for r in rows if r["kind"] not in ("corpus", "prompt_lookup"))
    assert len(next(r for r in rows if r["kind"] == "feature_head")["head_draft_steps"]) == 3  # n = 1, 2, 3
    assert "| mixed/default | float32 | PASS |" in capsys.readouterr().out


def test_gpu_check_verdicts_tell_a_shared_mismatch_from_a_failure():
    """A mismatch on a prompt where transformers' assisted decoding differs from plain greedy too is SHARED; one where
    transformers matches plain is FAIL (which makes `main` exit with 1)."""
    import torch

    gpu_check = recipe("benchmarks.gpu_check")

    class Target:
        def __init__(self, outputs):
            self.outputs = iter(outputs)

        def generate(self, prompt, **kwargs):
            from types import SimpleNamespace

            return SimpleNamespace(
                sequences=next(self.outputs), metasd=gpu_check.hf_metasd.MetaSDStats(["d"], "", "", 1)
            )

    a, b = torch.tensor([[1, 2]]), torch.tensor([[1, 3]])
    check = gpu_check.check_pool
    assert check(Target([a, a]), [], [a, a], [a, a], [True, True], 2)[:2] == ("PASS", [])
    assert check(Target([a, b]), [], [a, a], [a, a], [True, False], 2)[:2] == ("SHARED", [1])
    assert check(Target([b, a]), [], [a, a], [a, a], [True, False], 2)[:2] == ("FAIL", [0])


def test_acceptance_matrix_replays_a_feature_head_as_generate_runs_it(target):
    """The head's table (`head_position_table`), replayed with a fixed draft length, gives the rounds `generate` runs
    with the head alone: the same tokens accepted each round, the first round abstaining (no feature yet)."""
    from conftest import greedy, prompts
    from test_feature_head_drafter import trained_head

    import hf_metasd
    from hf_metasd.drafters import FeatureHeadDrafter

    matrix = recipe("pools.acceptance_matrix")
    drafter, n, new = FeatureHeadDrafter(trained_head(target)), 3, 20
    accepted_somewhere = 0
    for prompt in prompts(3, seed=5):
        answer = greedy(target, prompt, new)[0, prompt.shape[1] :].tolist()
        rows = matrix.position_table(drafter, target, prompt[0].tolist(), answer, n)
        assert len(rows) == len(answer) and rows[0] == (0, 0, 0.0)
        replayed, t = [], 0
        while t < len(rows):
            replayed.append(min(rows[t][1], n))
            t += replayed[-1] + 1
        out = target.generate(
            prompt,
            do_sample=False,
            max_new_tokens=new,
            custom_generate=hf_metasd.generate,
            assistant_models=[drafter],
            meta_policy="fixed",
            meta_no_draft=False,
            meta_draft_length="fixed",
            num_assistant_tokens=n,
            return_dict_in_generate=True,
        )
        assert out.sequences[0, prompt.shape[1] :].tolist() == answer
        assert out.metasd.accepted == replayed
        assert matrix.fixed_rounds(rows, n) == (len(replayed), sum(replayed))
        accepted_somewhere += sum(replayed)
    assert accepted_somewhere > 0  # the comparison saw accepted drafts, not only misses
