"""Compare policies on the embedded pool over development prompts (never benchmark prompts), in one run.

The prompts are `tune_policy.py`'s: per task, the first `--per-task` prompts of the val split `train_drafters.py`
held out (never trained on). Every policy runs on the embedded pool with its pool defaults (reward, draft length,
priors when the policy takes them) unless its extra arguments say otherwise; speedups are against autoregressive
decoding measured in the same run, and every output must equal it.

    python recipes/compare_policies.py                       # ucb (pool beta), ucb_scaled, with and without priors
    python recipes/compare_policies.py --policies '[["ucb beta=1", "ucb", {"meta_policy_kwargs": {"beta": 1.0}}]]'
"""

from __future__ import annotations

import argparse
import json

from tune_policy import add_dev_arguments, load_dev_setup  # recipes/ is on sys.path when this script runs

from hf_metasd.benchmark.methods import build_methods
from hf_metasd.benchmark.report import summarize
from hf_metasd.benchmark.run import run_bench

#: (method name, policy, extra `generate` kwargs); ``"meta_priors": {}`` runs the policy without the pool's priors.
POLICIES = [
    ["ucb_scaled", "ucb_scaled", {}],
    ["ucb_scaled (no priors)", "ucb_scaled", {"meta_priors": {}}],
    ["ucb beta=1 (no priors)", "ucb", {"meta_priors": {}}],
]


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
