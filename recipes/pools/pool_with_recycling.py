"""The embedded pool with a token recycling arm (and optionally another policy), saved as a pool folder for
``hf-metasd bench --pool``: how docs/benchmarks.md measures token recycling and the `throughput` policy on the
embedded SmolLM2 pool.

The embedded pool's drafters, reward, draft length and priors are kept; a `TokenRecyclingDrafter` joins as the arm
``token_recycling`` (no prior), its table warmed (``--warm``) on the target's greedy next token after every position
of the pool's own corpus documents (its answers to training prompts: no dev or benchmark prompt), and ``--policy``
replaces the pool's policy (a policy that does not take priors drops them). The pool is validated by `DrafterPool`
and saved with `save_pretrained` (the table with it).

Run from the repository root::

    python recipes/pools/pool_with_recycling.py artifacts/pool-recycling --warm --policy throughput
    hf-metasd bench --mixed --pool artifacts/pool-recycling --dtype float32 --policies ucb-speed --hf-assisted none
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.drafters import CorpusDrafter, TokenRecyclingDrafter  # noqa: E402
from hf_metasd.policies import POLICY_REGISTRY  # noqa: E402
from hf_metasd.pool import DrafterPool  # noqa: E402


def main(argv=None) -> DrafterPool:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="where the pool is saved")
    p.add_argument("--warm", action="store_true", help="warm the table on the pool's corpus documents")
    p.add_argument("--max-documents", type=int, default=2000, help="corpus documents the warm start reads")
    p.add_argument("--policy", default=None, help="the saved pool's policy (default: the embedded pool's)")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(torch.float32)
    embedded = load_embedded_pool(target)
    recycling = TokenRecyclingDrafter()
    if args.warm:
        corpus = next(d for d in embedded.drafters if isinstance(d, CorpusDrafter) and d.name == "corpus_all")
        documents = corpus.index.documents()[: args.max_documents]
        start = time.perf_counter()
        read = recycling.warm_start(target, documents)
        print(
            f"warm start: {read} positions of {len(documents)} documents, {len(recycling.table)} rows, "
            f"{time.perf_counter() - start:.0f} s"
        )
    policy = args.policy or embedded.policy
    keeps_priors = POLICY_REGISTRY[policy].supports_prior
    pool = DrafterPool(
        [*embedded.drafters, recycling],
        target=target,
        policy=policy,
        policy_kwargs=embedded.policy_kwargs if policy == embedded.policy else {},
        reward=embedded.reward,
        num_assistant_tokens=embedded.num_assistant_tokens,
        tokenizer=tokenizer,
        priors=embedded.priors if keeps_priors else None,
        prior_weight=embedded.prior_weight if keeps_priors else None,
    )
    pool.save_pretrained(args.out)
    print(f"saved {[d.name for d in pool.drafters]} (policy {policy}) to {args.out}")
    return pool


if __name__ == "__main__":
    main()
