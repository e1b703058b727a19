"""Priors for the ``--models qwen`` pool: each arm's measured speed drafting alone on dev prompts.

The embedded SmolLM2 pool ships each arm's mean `speed` reward on dev prompts as a prior
(`recipes/pools/build_default_pool.py`), so a policy does not have to pay a round, and a drafter's prompt prefill, to learn
that an arm is poor. The ``--models qwen`` pool (Qwen2.5-Coder-1.5B target; Qwen2.5-Coder-0.5B in float32 and in
int8, prompt lookup, a corpus, token recycling) is assembled in code, and without priors a per-call bandit's first
call tries every model arm. This recipe measures the same quantity for it with the real target, on the dev split of
`../shared/data/train/` (`recipes/pools/generate_task_outputs.py`'s `task_split`: never a benchmark prompt):

.. math::

    \\text{prior}_a = \\frac{1}{N + 1} \\cdot \\frac{T_\\text{plain}}{T_a}

where :math:`T_\\text{plain}` is plain greedy `generate`'s wall time over the dev prompts and :math:`T_a` MetaSD's
with arm :math:`a` alone (``meta_policy="fixed"``), measured in one run, the drafter's prompt prefill included. It
is the `speed` reward's scale (``(E + 1) / (N + 1) * c_plain / c_arm``, the no-draft arm :math:`1 / (N + 1)`) taken
over the whole call instead of per round. Every output is checked against plain `generate`. The file it writes
(default `hf_metasd/data/qwen_pool.json`) is what `hf_metasd.benchmark.run.load_pool` gives the pool as its
priors (two pseudo-observations each, as the embedded pool's).

    python recipes/pools/qwen_pool_priors.py                      # 1 dev prompt per task, 32 new tokens (the bench's shape)
    python recipes/pools/qwen_pool_priors.py --per-task 2 --out /tmp/qwen_pool.json

Needs the Qwen2.5-Coder packages of `../shared/MODELS.md` (about 9 GB of RAM), ~10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`
import hf_metasd  # noqa: E402
from hf_metasd import reward_memory_scope  # noqa: E402
from hf_metasd.benchmark.report import machine  # noqa: E402
from hf_metasd.benchmark.run import QWEN_POOL_FILE, load_models, load_pool  # noqa: E402
from hf_metasd.candidate_generator import NO_DRAFT  # noqa: E402
from recipes.pools.generate_task_outputs import dev_prompts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--per-task", type=int, default=1, help="dev prompts per task (the first ones of the split)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-assistant-tokens", type=int, default=8, help="the pool's draft length cap")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter-dtype", default=None, help="the pool's drafter models' dtype (default: float32)")
    parser.add_argument("--policy", default="throughput", help="the policy the file names as the pool's")
    parser.add_argument("--out", type=Path, default=QWEN_POOL_FILE)
    args = parser.parse_args()

    target, tokenizer = load_models("qwen", "float32", args.threads)
    pool = load_pool(target, "qwen", tokenizer=tokenizer, drafter_dtype=args.drafter_dtype, priors=False)
    names = [d.name for d in pool.drafters]
    prompts = dev_prompts(args.data_dir, tokenizer, args.per_task)
    common = {
        "do_sample": False,
        "max_new_tokens": args.max_new_tokens,
        "num_assistant_tokens": args.num_assistant_tokens,
        "pad_token_id": tokenizer.pad_token_id,
    }
    plain_kwargs = {k: v for k, v in common.items() if k != "num_assistant_tokens"}
    target.generate(prompts[0], **plain_kwargs)  # warm-up: first-call costs out of the timings
    with reward_memory_scope("warm-up"):
        target.generate(prompts[0], custom_generate=hf_metasd.generate, assistant_models=pool, **common)
    seconds = {"plain": 0.0, **dict.fromkeys(names, 0.0)}
    pool_seconds = 0.0
    for number, ids in enumerate(prompts, 1):
        start = time.perf_counter()
        reference = target.generate(ids, **plain_kwargs)
        seconds["plain"] += time.perf_counter() - start
        for arm, name in enumerate(names):
            start = time.perf_counter()
            with reward_memory_scope(name):  # what an arm's calls learn (token recycling's table too) stays its own
                out = target.generate(
                    ids,
                    custom_generate=hf_metasd.generate,
                    assistant_models=pool,
                    meta_policy="fixed",
                    meta_policy_kwargs={"arm": arm},
                    **common,
                )
            seconds[name] += time.perf_counter() - start
            if not torch.equal(out, reference):
                raise SystemExit(f"{name} changed the output: a losslessness bug, please report it")
        start = time.perf_counter()  # the pool's defaults (its policy over every arm): reported, not a prior
        with reward_memory_scope("pool defaults"):
            out = target.generate(ids, custom_generate=hf_metasd.generate, assistant_models=pool, **common)
        pool_seconds += time.perf_counter() - start
        if not torch.equal(out, reference):
            raise SystemExit("the pool's defaults changed the output: a losslessness bug, please report it")
        print(
            f"prompt {number}/{len(prompts)}: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
            + f", pool defaults {pool_seconds:.1f} s",
            flush=True,
        )
    n = args.num_assistant_tokens
    priors = {name: round(min(1.0, seconds["plain"] / seconds[name] / (n + 1)), 4) for name in names}
    priors[NO_DRAFT] = round(1.0 / (n + 1), 4)
    info = machine()  # the commit, processor, torch threads and version, as the bench records them
    record = {
        "policy": args.policy,
        "priors": priors,
        "speedup_alone": {name: round(seconds["plain"] / seconds[name], 3) for name in names},
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "pool_defaults": {"policy": args.policy, "seconds": round(pool_seconds, 2)},
        "measured_on": {
            "prompts": f"dev split of ../shared/data/train, {args.per_task} per task ({len(prompts)})",
            "max_new_tokens": args.max_new_tokens,
            "num_assistant_tokens": n,
            "drafter_dtype": args.drafter_dtype or "float32",
            "commit": info["commit"],
            "machine": f"{info['processor']}, {info['torch_threads']} threads, torch {info['torch']}",
            "command": "python recipes/pools/qwen_pool_priors.py " + " ".join(sys.argv[1:]),
        },
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    for name in names:
        print(f"{name:>24}: {record['speedup_alone'][name]:.2f}x plain alone -> prior {priors[name]:.4f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
