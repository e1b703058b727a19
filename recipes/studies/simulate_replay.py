"""Replayed rounds on or off, simulated on the dev-prompt table: what side observations of the model-free arms buy.

Reads the table `recipes/pools/acceptance_matrix.py` writes and replays MetaSD calls with `recipes/pools/pool_simulation.py`
(real policies and rewards, measured costs, no target runs) for two pools, the embedded pool's first four arms and
every candidate, under a few policies, with and without replayed rounds; prints the simulated dev speedup per task
and overall. Simulated figures rank choices; the docs quote measured ones.

    python recipes/studies/simulate_replay.py --table artifacts/acceptance-replay/table.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from recipes.pools.build_default_pool import load_costs  # noqa: E402
from recipes.pools.pool_simulation import evaluate, measured_priors  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402

#: (policy, settings, whether the pool's priors are given)
POLICIES = [("ucb", {"beta": 0.1}, True), ("ucb_scaled", {}, True), ("ucb_scaled", {}, False), ("thompson", {}, True)]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, default=REPO_ROOT / "artifacts" / "acceptance" / "table.pt")
    parser.add_argument("--num-assistant-tokens", type=int, default=3)
    args = parser.parse_args(argv)
    data = torch.load(args.table)
    table, n = data["table"], args.num_assistant_tokens
    costs = load_costs(data, data["record_tokens"])
    tasks = [t for t in TASKS if t in next(iter(table.values()))]
    first_four = ["prompt_lookup", "general", "corpus_mt_bench", "corpus_code"]
    pools = {"embedded 4 arms": [a for a in first_four if a in table], "every candidate": list(table)}
    results = {}
    for label, names in pools.items():
        for policy, settings, with_priors in POLICIES:
            priors = measured_priors(table, names, tasks, costs, n) if with_priors else None
            row = {}
            for replay in (False, True):
                row[replay] = evaluate(
                    table,
                    names,
                    tasks,
                    costs,
                    policy=policy,
                    policy_kwargs=settings,
                    num_assistant_tokens=n,
                    priors=priors,
                    prior_weight=2.0,
                    replay=replay,
                )
            key = f"{label} | {policy} {settings} {'priors' if with_priors else 'no priors'}"
            results[key] = row
            cells = " ".join(f"{t} {row[False][t]:.3f}->{row[True][t]:.3f}" for t in [*tasks, "overall"])
            print(f"{key}: {cells}", flush=True)
    return results


if __name__ == "__main__":
    main()
