"""How close a pool of useless drafters gets to plain speed, by exploration setting (dev prompts only).

With ``--embedded``, the embedded pool instead, under its own defaults.

A pool of `--drafters` untrained 2-layer drafters of the target's vocabulary (plus the no-draft arm), the first dev
prompt of each task (`recipes/pools/generate_task_outputs.py`'s split: never a benchmark prompt, never a training prompt),
greedy, `--max-new-tokens` tokens, a fresh policy per call (which, unless ``meta_learned_priors`` is off, starts from
what the same setting's earlier calls learnt: `hf_metasd.reward_memory`). Prints the wall time of plain `generate` and of MetaSD
under each policy setting, measured in one run on this machine, and checks every output against plain `generate`;
then, per setting, its target passes, the tokens each pass verified (1 + drafted) and the milliseconds per pass by
part (verification, drafting with catch-up and prefill, MetaSD's own work: policy, reward, kernel choice, replay).

    python recipes/benchmarks/untrained_pool_probe.py
    python recipes/benchmarks/untrained_pool_probe.py --embedded
    python recipes/benchmarks/untrained_pool_probe.py --embedded --per-task 3 --drop general

``--drop ARM`` (with ``--embedded``, repeatable) adds a setting: the pool's defaults on the pool without that arm
(its prior dropped with it), run in the same loop, so that an arm's measured contribution on dev prompts is the
ratio of two rows of one run. ``--pool PATH`` (repeatable) adds the defaults of another saved pool for the same
target (e.g. the embedded pool of an earlier commit, ``git archive <commit> hf_metasd/data/pools | tar -x -C DIR``),
so that a rebuilt pool is compared with the one it replaces in one run.

``--first-kernel stock`` makes the layer-level kernel measurement answer "stock" (as a burst of load from another
process can make it answer): how much of the loss the checks on whole passes (`hf_metasd.kernels.PassKernels`)
recover; ``--no-pass-check`` runs the first choice for every pass, as before those checks. ``--no-one-row`` keeps
one-token passes on the stock kernel (no repeated-row product).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import hf_metasd
from hf_metasd import DrafterPool, kernels
from hf_metasd.benchmark.methods import untrained_drafters
from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`
from recipes.benchmarks.bench_goals import PARTS  # noqa: E402  (the parts of a pass -> `MetaSDStats` timers)
from recipes.pools.generate_task_outputs import dev_prompts  # noqa: E402

#: name -> (policy, policy kwargs[, other MetaSD settings of `generate`])
SETTINGS = {
    "ucb_scaled (the default)": ("ucb_scaled", {}),
    "ucb_scaled, each call from nothing": ("ucb_scaled", {}, {"meta_learned_priors": False}),
    "ucb beta=1 (the paper's default)": ("ucb", {}),
    "ucb beta=0.1": ("ucb", {"beta": 0.1}),
}
#: the same for `--embedded` (policy None: the pool's own defaults and priors)
EMBEDDED_SETTINGS = {
    "pool defaults": (None, {}),
}


def without_arm(pool: DrafterPool, arm: str) -> DrafterPool:
    """`pool` less the drafter named `arm`, with the same defaults and the other arms' priors."""
    names = [drafter.name for drafter in pool.drafters]
    if arm not in names:
        raise SystemExit(f"`--drop` must name an arm of the pool, one of {names}, but is {arm!r}.")
    kwargs = pool.generate_kwargs()
    priors = kwargs["meta_priors"]
    return DrafterPool(
        [drafter for drafter in pool.drafters if drafter.name != arm],
        target=pool.target,
        policy=kwargs["meta_policy"],
        policy_kwargs=kwargs["meta_policy_kwargs"],
        reward=kwargs["meta_reward"],
        num_assistant_tokens=kwargs["num_assistant_tokens"],
        priors=None if priors is None else {name: mean for name, mean in priors.items() if name != arm},
        prior_weight=kwargs["meta_prior_weight"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--drafters", type=int, default=3)
    parser.add_argument("--embedded", action="store_true", help="the embedded pool instead of untrained drafters")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--first-kernel", choices=["skinny", "stock"], default=None, help="force the first choice")
    parser.add_argument("--no-pass-check", action="store_true", help="keep the first choice for every pass")
    parser.add_argument("--no-one-row", action="store_true", help="one-token passes: stock kernel only")
    parser.add_argument("--per-task", type=int, default=1, help="dev prompts per task (the first ones of the split)")
    parser.add_argument("--drop", action="append", default=[], help="with --embedded: also run without this arm")
    parser.add_argument("--pool", action="append", default=[], help="with --embedded: also run this saved pool")
    parser.add_argument("--settings", type=json.loads, default=None, help="JSON: name -> [policy, kwargs(, settings)]")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.first_kernel is not None:
        first = kernels.KernelChoice(args.first_kernel, measured=True)
        kernels.choose_verification_kernel = lambda *a, **k: first
    if args.no_pass_check:  # every length's comparison decided for the first choice, never re-checked
        kernels.PassKernels.choose = lambda self, k: self.first_choice if 2 <= k <= self.max_rows else None
    if args.no_one_row:  # one-token passes never try the row repeated twice, as before that candidate
        choose = kernels.PassKernels.choose
        kernels.PassKernels.choose = lambda self, k: None if k == 1 else choose(self, k)
    target, tokenizer = load_default_target(torch.float32)
    if args.embedded:
        pool = load_embedded_pool(target)
    else:
        pool = DrafterPool(untrained_drafters(target, args.drafters), target=target)
    if args.settings is None:
        args.settings = EMBEDDED_SETTINGS if args.embedded else SETTINGS
    pools = dict.fromkeys(args.settings, pool)
    for path in args.pool:
        name = f"pool {path}"
        args.settings = {**args.settings, name: (None, {})}
        pools[name] = load_embedded_pool(target, path)
    for arm in args.drop:
        name = f"pool defaults without {arm}"
        args.settings = {**args.settings, name: (None, {})}
        pools[name] = without_arm(pool, arm)
    prompts = dev_prompts(args.data_dir, tokenizer, args.per_task)
    common = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
    target.generate(prompts[0], **common)  # warm-up: first-call costs (kernel choice, allocator) out of the timings
    target.generate(prompts[0], custom_generate=hf_metasd.generate, assistant_models=pool, **common)
    hf_metasd.clear_reward_memory()  # what the warm-up learnt: no setting starts with it
    seconds = {"plain": 0.0, **dict.fromkeys(args.settings, 0.0)}
    passes = {name: dict.fromkeys(("passes", "verified", *PARTS), 0.0) for name in args.settings}
    for ids in prompts:
        start = time.perf_counter()
        reference = target.generate(ids, **common)
        seconds["plain"] += time.perf_counter() - start
        for name, (policy, kwargs, *settings) in args.settings.items():
            start = time.perf_counter()
            with hf_metasd.reward_memory_scope(name):  # each setting learns from its own calls only
                out = target.generate(
                    ids,
                    custom_generate=hf_metasd.generate,
                    assistant_models=pools[name],
                    **({} if policy is None else {"meta_policy": policy, "meta_policy_kwargs": kwargs}),
                    **(settings[0] if settings else {}),
                    return_dict_in_generate=True,
                    **common,
                )
            seconds[name] += time.perf_counter() - start
            stats, out = out.metasd, out.sequences
            tally = passes[name]
            tally["passes"] += len(stats.drafted)
            tally["verified"] += len(stats.drafted) + sum(stats.drafted)
            for part, names in PARTS.items():
                tally[part] += sum(getattr(stats, f"{n}_seconds") for n in names)
            if not torch.equal(out, reference):
                raise SystemExit(f"{name} changed the output: a losslessness bug, please report it")
    for name, value in seconds.items():
        print(f"{name:>34}: {value:6.1f} s   {seconds['plain'] / value:.2f}x plain")
    print("per target pass: tokens verified; ms of verification, drafting, MetaSD's own work, all")
    for name, tally in passes.items():
        n = tally["passes"]
        ms = "  ".join(f"{part} {1000 * tally[part] / n:5.1f}" for part in PARTS)
        print(
            f"{name:>34}: {int(n)} passes  {tally['verified'] / n:.2f} tokens  {ms}  all {1000 * seconds[name] / n:5.1f}"
        )


if __name__ == "__main__":
    main()
