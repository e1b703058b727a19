"""The embedded pool with a trained feature head added as one more arm, saved as a pool folder for
``hf-metasd bench --pool``: how docs/benchmarks.md measures a head inside `generate`.

The embedded pool's drafters, policy, reward, draft length and priors are kept; the head (a folder of `save_head`,
e.g. `train_feature_head.py`'s ``--out``, or speculators' layout; `load_feature_head` checks it) joins as the arm
``head`` with no prior, and each per-task adapter under ``<head>/adapters/<task>/`` (the kept adapters of
``train_feature_head.py --lora-task``) as one more arm ``head_<task>`` sharing the head. The pool is validated by
`DrafterPool` and saved with `save_pretrained` (the head and its adapters with it).

Run from the repository root::

    python recipes/pools/pool_with_head.py artifacts/head-2k artifacts/pool-head2k
    hf-metasd bench --mixed --pool artifacts/pool-head2k --dtype bfloat16 --policies --hf-assisted none
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.pool import DrafterPool  # noqa: E402
from recipes.pools.acceptance_matrix import head_arms  # noqa: E402


def main(argv=None) -> DrafterPool:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("head", type=Path, help="a feature head folder (`save_head`'s or speculators' layout)")
    p.add_argument("out", type=Path, help="where the pool is saved")
    args = p.parse_args(argv)
    target, tokenizer = load_default_target(torch.float32)
    embedded = load_embedded_pool(target)
    pool = DrafterPool(
        [*embedded.drafters, *head_arms(target, args.head, "head")],
        target=target,
        policy=embedded.policy,
        policy_kwargs=embedded.policy_kwargs,
        reward=embedded.reward,
        num_assistant_tokens=embedded.num_assistant_tokens,
        tokenizer=tokenizer,
        priors=embedded.priors,
        prior_weight=embedded.prior_weight,
    )
    pool.save_pretrained(args.out)
    print(f"saved {[d.name for d in pool.drafters]} to {args.out}")
    return pool


if __name__ == "__main__":
    main()
