"""Choose the embedded pool's policy settings (UCB's beta, the reward, the draft length) on development prompts.

The benchmark prompts (Spec-Bench, HumanEval) must not be used to tune anything, and the drafters were trained on
`<data-dir>/train/<task>.jsonl`. This recipe takes, per task, the prompts `train_drafters.py` held out as its val
split (same seed, same shuffle, same length filter: never trained on), runs them as one interleaved stream through
`hf_metasd.benchmark` with a grid of settings, and prints speedups against autoregressive decoding measured in the
same run. Every output must equal autoregressive greedy decoding (the run fails otherwise).

    python recipes/tune_policy.py                 # 2 prompts per task, 64 new tokens: ~10 min on 2 cores
    python recipes/tune_policy.py --per-task 1    # faster, noisier

Writes `--out/tuning.json` (default `docs/assets/bench/`) with the settings, the machine and every run.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from generate_task_outputs import task_split  # recipes/ is on sys.path when this script runs

from hf_metasd.benchmark.methods import Method, build_methods
from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool
from hf_metasd.benchmark.prompts import BENCH_TASKS, BenchPrompt, mixed_stream
from hf_metasd.benchmark.report import machine, summarize
from hf_metasd.benchmark.run import run_bench

REPO_ROOT = Path(__file__).resolve().parents[1]


def dev_prompts(data_dir: Path, tokenizer, per_task: int, seed: int, val_prompts: int, max_prompt_tokens: int):
    """The first `per_task` of each task's val split in `train_drafters.py` (prompts never trained on)."""
    out = []
    for task in BENCH_TASKS:
        dev, _ = task_split(data_dir, task, tokenizer, seed, val_prompts, max_prompt_tokens)
        out += [BenchPrompt(task, f"dev/{task}/{i}", text) for i, (text, _) in enumerate(dev[:per_task])]
    return mixed_stream(out)


def add_dev_arguments(parser: argparse.ArgumentParser) -> None:
    """`--data-dir`, `--per-task`, `--threads` and the dev split's settings; the split ones must match the
    train_drafters.py run that built the pool (its training_metrics.json records them)."""
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--per-task", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-prompts", type=int, default=10)
    parser.add_argument("--max-prompt-tokens", type=int, default=768)


def load_dev_setup(args: argparse.Namespace):
    """The target (float32, `args.threads` threads), its tokenizer, the embedded pool and the dev prompts."""
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(torch.float32)
    prompts = dev_prompts(args.data_dir, tokenizer, args.per_task, args.seed, args.val_prompts, args.max_prompt_tokens)
    return target, tokenizer, load_embedded_pool(target), prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--betas", type=float, nargs="*", default=[1.0, 0.25, 0.05])
    parser.add_argument("--draft-lengths", type=int, nargs="*", default=[2, 3, 4])
    parser.add_argument("--lookup-lengths", type=int, nargs="*", default=[6, 8])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "assets" / "bench")
    add_dev_arguments(parser)
    args = parser.parse_args()
    target, tokenizer, pool, prompts = load_dev_setup(args)
    names = [d.name for d in pool.drafters]

    def with_length(policies: tuple, n: int) -> list[Method]:
        """`hf_metasd.benchmark` methods for `policies` drafting `n` tokens per round, named with their length."""
        methods = build_methods(
            pool.drafters,
            num_assistant_tokens=n,
            policies=policies,
            transformers_baselines="none",
            fixed_baselines=False,
        )
        return [replace(m, name=f"{m.name} N={n}") for m in methods if m.kind == "metasd"]

    fixed = tuple(
        (f"fixed[{arm}]", "fixed", "bd", {"meta_policy_kwargs": {"arm": names.index(arm)}})
        for arm in ("general", "prompt_lookup")
    )
    ucb = tuple(
        (f"ucb-{reward} beta={beta}", "ucb", reward, {"meta_policy_kwargs": {"beta": beta}})
        for beta in args.betas
        for reward in ("bd", "cost")
    )
    methods = [Method("autoregressive", "autoregressive", lambda prompt: {})]
    for n in args.draft_lengths:
        methods += with_length(fixed + ucb, n)
    for n in args.lookup_lengths:  # prompt lookup drafts for free: longer drafts may pay where model drafts do not
        methods += with_length(fixed[1:], n)
    print(f"tune: {len(prompts)} dev prompts x {len(methods)} settings, max_new_tokens={args.max_new_tokens}")
    start = time.perf_counter()
    records = run_bench(target, tokenizer, prompts, methods, max_new_tokens=args.max_new_tokens)
    summary = summarize(records, names)
    rows = sorted(((m, s["overall"]) for m, s in summary.items()), key=lambda kv: -kv[1]["speedup"])
    print("setting | speedup vs autoregressive | tau | identical")
    for method, overall in rows:
        print(
            f"{method} | {overall['speedup']:.3f} | {overall['mean_accepted_tokens']:.2f} | {overall['identical']:.2f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "machine": machine(),
        "prompts": [p.id for p in prompts],
        "max_new_tokens": args.max_new_tokens,
        "wall_seconds": time.perf_counter() - start,
        "overall": {m: s["overall"] for m, s in summary.items()},
        "per_task": {m: {t: v["speedup"] for t, v in s.items() if t != "overall"} for m, s in summary.items()},
    }
    (args.out / "tuning.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(f"wrote {args.out / 'tuning.json'} ({report['wall_seconds']:.0f} s)")
    if any(not r.identical for r in records):
        raise SystemExit("ERROR: an output differs from autoregressive greedy decoding")


if __name__ == "__main__":
    main()
