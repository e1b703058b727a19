"""The ``--models qwen`` pool under settings of MetaSD, against plain `generate`, on dev prompts (one run).

Each setting is a set of `generate` keyword arguments on top of the pool's defaults; they run interleaved per
prompt, each in its own reward-memory scope (a setting learns only from its own calls), after one untimed warm-up
call per setting on the first prompt (its own scope too), so that no setting pays the process's one-time costs. The
prompts are the dev split of `../shared/data/train/` (`recipes/pools/generate_task_outputs.py`'s `task_split`: never a
benchmark prompt); every output is checked against plain greedy `generate`. Prints the wall time of each setting over
plain's and its target passes.

    python recipes/benchmarks/qwen_pool_probe.py
    python recipes/benchmarks/qwen_pool_probe.py --settings '{"fixed length": {"meta_draft_length": "fixed"}}'

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
from hf_metasd.benchmark.run import load_models, load_pool  # noqa: E402
from hf_metasd.reward_memory import reward_memory_scope  # noqa: E402
from recipes.pools.generate_task_outputs import dev_prompts  # noqa: E402

DEFAULT_SETTINGS = {
    "pool defaults": {},
    "fixed[qwen2.5-coder-0.5b]": {"meta_policy": "fixed", "meta_policy_kwargs": {"arm": 0}},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--per-task", type=int, default=1, help="dev prompts per task (the first ones of the split)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter-dtype", default="bfloat16")
    parser.add_argument("--settings", type=json.loads, default=DEFAULT_SETTINGS, help="JSON: name -> generate kwargs")
    args = parser.parse_args()

    target, tokenizer = load_models("qwen", "float32", args.threads)
    pool = load_pool(target, "qwen", tokenizer=tokenizer, drafter_dtype=args.drafter_dtype)
    prompts = dev_prompts(args.data_dir, tokenizer, args.per_task)
    plain = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
    calls = {
        name: {**plain, "custom_generate": hf_metasd.generate, "assistant_models": pool, **kwargs}
        for name, kwargs in args.settings.items()
    }
    target.generate(prompts[0], **plain)  # warm-up
    for name, kwargs in calls.items():
        with reward_memory_scope(("warm-up", name)):
            target.generate(prompts[0], **kwargs)
    seconds = {"plain": 0.0, **dict.fromkeys(calls, 0.0)}
    passes = dict.fromkeys(calls, 0)
    for number, ids in enumerate(prompts, 1):
        start = time.perf_counter()
        reference = target.generate(ids, **plain)
        seconds["plain"] += time.perf_counter() - start
        for name, kwargs in calls.items():
            with reward_memory_scope(name):
                start = time.perf_counter()
                out = target.generate(ids, **kwargs, return_dict_in_generate=True)
                seconds[name] += time.perf_counter() - start
            if not torch.equal(out.sequences, reference):
                raise SystemExit(f"{name} changed the output: a losslessness bug, please report it")
            passes[name] += out.metasd.rounds
        print(
            f"prompt {number}/{len(prompts)} ({ids.shape[1]} tokens): "
            + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()),
            flush=True,
        )
    for name in calls:
        print(f"{name:>28}: {seconds['plain'] / seconds[name]:.3f}x plain, {passes[name]} passes")


if __name__ == "__main__":
    main()
