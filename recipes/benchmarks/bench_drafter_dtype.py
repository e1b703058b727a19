"""What a drafter model costs in bfloat16 and in float32: median ms of a prompt prefill of `--context` tokens and of
one drafting step after it, for the drafter's body (the LM head, often restricted, is left out), 2 threads. The
drafter is Qwen2.5-Coder-0.5B-Instruct with `--drafter qwen0.5b`, the `--models qwen` pool's same-tokenizer drafter
(loaded offline, see `hf_metasd.benchmark.offline.load_qwen_coder`), or the embedded pool's `general` (stored in
bfloat16; the default, measured in `hf_metasd.drafters.prefill`'s docstring), which the embedded pool no longer
holds since its rebuild from corpora: the default then stops with a message.

On CPUs without native bfloat16 arithmetic a bfloat16 prefill can cost several times a float32 one, while a
one-token step, bound by memory traffic, can be cheaper in bfloat16. Which wins on a machine is a measurement, so
this recipe prints both rather than the library choosing one.

    python recipes/benchmarks/bench_drafter_dtype.py
    python recipes/benchmarks/bench_drafter_dtype.py --context 64 600
    python recipes/benchmarks/bench_drafter_dtype.py --drafter qwen0.5b --context 64 600 --reps 3
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from transformers import DynamicCache

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool, load_qwen_coder


def prefill_and_step_ms(model, length: int, reps: int) -> tuple[float, float]:
    """Median ms of a `length`-token prefill of `model`'s body and of one step after it."""
    runs = []
    for _ in range(reps):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            start = time.perf_counter()
            model.model(input_ids=torch.randint(100, 1000, (1, length)), cache=cache, use_cache=True)
            prefill = time.perf_counter() - start
            start = time.perf_counter()
            model.model(input_ids=torch.randint(100, 1000, (1, 1)), cache=cache, use_cache=True)
            runs.append((prefill, time.perf_counter() - start))
    prefills = sorted(r[0] for r in runs)
    steps = sorted(r[1] for r in runs)
    return 1000 * prefills[len(runs) // 2], 1000 * steps[len(runs) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--context", type=int, nargs="*", default=[64, 600])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", choices=["general", "qwen0.5b"], default="general")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.drafter == "general":
        target, _ = load_default_target(torch.float32)
        drafters = {d.name: d for d in load_embedded_pool(target).drafters}
        if "general" not in drafters:
            raise SystemExit(
                f"`--drafter general` needs the embedded pool's `general` drafter, but the pool holds {sorted(drafters)} "
                "(its rebuild from corpora dropped it). Run with `--drafter qwen0.5b`."
            )
        drafter = drafters["general"].model
    else:
        drafter, _ = load_qwen_coder("0.5b", torch.bfloat16)
    variants = {str(drafter.dtype).removeprefix("torch."): drafter, "float32": copy.deepcopy(drafter).float()}
    print("context | dtype | prefill ms | step ms")
    for length in args.context:
        for name, model in variants.items():
            prefill, step = prefill_and_step_ms(model, length, args.reps)
            print(f"{length:>7} | {name:>8} | {prefill:>10.1f} | {step:>7.2f}")


if __name__ == "__main__":
    main()
