"""Compare policies on the embedded pool over development prompts (never benchmark prompts), in one run.

The prompts: per task, the first `--per-task` prompts of the dev split (`recipes/pools/generate_task_outputs.py`'s
`task_split`: the val split `train_drafters.py` held out, never trained on, never a benchmark prompt). Every policy
runs on the embedded pool with its pool defaults (reward, draft length, priors when the policy takes them) unless its
extra arguments say otherwise; speedups are against autoregressive decoding measured in the same run, and every
output must equal it.

    python recipes/benchmarks/compare_policies.py          # ucb (pool beta), ucb_scaled, with and without priors
    python recipes/benchmarks/compare_policies.py --policies '[["ucb beta=1", "ucb", {"meta_policy_kwargs": {"beta": 1.0}}]]'
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: the other recipes import as `recipes.<group>.<name>`

from hf_metasd.benchmark.methods import build_methods  # noqa: E402
from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.benchmark.prompts import BENCH_TASKS, BenchPrompt, mixed_stream  # noqa: E402
from hf_metasd.benchmark.report import summarize  # noqa: E402
from hf_metasd.benchmark.run import run_bench  # noqa: E402
from recipes.pools.generate_task_outputs import task_split  # noqa: E402

#: (method name, policy, extra `generate` kwargs); ``"meta_priors": {}`` runs the policy without the pool's priors.
POLICIES = [
    ["ucb_scaled", "ucb_scaled", {}],
    ["ucb_scaled (no priors)", "ucb_scaled", {"meta_priors": {}}],
    ["ucb beta=1 (no priors)", "ucb", {"meta_priors": {}}],
]


def dev_prompts(data_dir: Path, tokenizer, per_task: int, seed: int, val_prompts: int, max_prompt_tokens: int):
    """The first `per_task` of each task's dev split as one interleaved stream of bench prompts."""
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
    parser.add_argument("--policies", type=json.loads, default=POLICIES, help="JSON: [[name, policy, kwargs], ...]")
    add_dev_arguments(parser)
    args = parser.parse_args()
    target, tokenizer, pool, prompts = load_dev_setup(args)
    names = [d.name for d in pool.drafters]
    policies = tuple((name, policy, "speed", kwargs) for name, policy, kwargs in args.policies)
    methods = build_methods(pool, policies=policies, transformers_baselines="none", fixed_baselines=False)
    print(f"compare: {len(prompts)} dev prompts x {len(methods)} methods, max_new_tokens={args.max_new_tokens}")
    records = run_bench(target, tokenizer, prompts, methods, max_new_tokens=args.max_new_tokens)
    summary = summarize(records, names)
    tasks = [t for t in next(iter(summary.values())) if t != "overall"]
    print("method | overall | " + " | ".join(tasks) + " | identical")
    for method, per_task in summary.items():
        cells = " | ".join(f"{per_task[t]['speedup']:.2f}" for t in tasks)
        print(f"{method} | {per_task['overall']['speedup']:.3f} | {cells} | {per_task['overall']['identical']:.2f}")
    if any(not r.identical for r in records):
        raise SystemExit("ERROR: an output differs from autoregressive greedy decoding")


if __name__ == "__main__":
    main()
