"""Which draft-length cap (`num_assistant_tokens`) the embedded pool should ship, measured in one run per dtype.

Under ``meta_draft_length="measured"`` (the default) the cap is only an upper bound: every round drafts the length
this machine verifies fastest per expected token, read from the rounds' own pass costs, and corpus drafters draft the
cap and are cut by their match class. A cap of 3 was tuned where a wide pass is dear (float32 on a 2-core CPU); where
width is nearly free (bfloat16 with matrix units, GPUs) longer drafts pay. This recipe runs plain `generate` and
MetaSD with the embedded pool at several caps on the same prompts, interleaved, and prints each cap's speedup over
plain, overall and per task (greedy; every output checked under its dtype's contract, `hf_metasd.lossless`).

Tune on the dev split, never on benchmark prompts:

    python recipes/pools/export_dev_prompts.py --out artifacts/dev_prompts.jsonl
    python recipes/benchmarks/draft_length_cap.py --prompts artifacts/dev_prompts.jsonl --dtype bfloat16
    python recipes/benchmarks/draft_length_cap.py --prompts artifacts/dev_prompts.jsonl --dtype float32
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=Path, required=True, help="a bench --prompts file (the dev split)")
    p.add_argument("--per-task", type=int, default=2)
    p.add_argument("--caps", type=int, nargs="+", default=[3, 5, 8])
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pool", default=None, help="pool folder (default: the embedded pool)")
    p.add_argument(
        "--with-prompt-lookup",
        action="store_true",
        help="also run each cap with prompt lookup added to the pool (its prior: the no-draft arm's)",
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "draft_length_cap")
    args = p.parse_args(argv)

    from hf_metasd.benchmark.methods import Method
    from hf_metasd.benchmark.offline import load_embedded_pool
    from hf_metasd.benchmark.prompts import load_prompts_file, mixed_stream
    from hf_metasd.benchmark.report import machine, summarize
    from hf_metasd.benchmark.run import load_target, run_bench
    from hf_metasd.generation import generate as metasd_generate

    prompts = mixed_stream(load_prompts_file(args.prompts, None, args.per_task))
    target, tokenizer, dtype = load_target("smollm2", args.dtype, args.threads)
    pool = load_embedded_pool(target, args.pool)
    pools = {"": pool}
    if args.with_prompt_lookup:
        from hf_metasd.drafters import PromptLookupDrafter
        from hf_metasd.pool import DrafterPool

        kwargs = pool.generate_kwargs()
        priors = dict(pool.priors or {})
        if priors:
            priors["prompt_lookup"] = priors.get("no_draft", 0.25)
        pools["+prompt_lookup"] = DrafterPool(
            [*pool.drafters, PromptLookupDrafter()],
            target=target,
            policy=kwargs.get("meta_policy", pool.policy),
            policy_kwargs=pool.policy_kwargs,
            reward=pool.reward,
            priors=priors or None,
            prior_weight=pool.prior_weight,
        )

    def capped(n: int, members):
        return lambda prompt: {
            "custom_generate": metasd_generate,
            "assistant_models": members,
            "return_dict_in_generate": True,
            "num_assistant_tokens": n,
        }

    methods = [Method("autoregressive", "autoregressive", lambda prompt: {})]
    methods += [
        Method(f"metasd[N={n}{suffix}]", "metasd", capped(n, members))
        for n in args.caps
        for suffix, members in pools.items()
    ]
    records = run_bench(target, tokenizer, prompts, methods, max_new_tokens=args.max_new_tokens)
    summary = summarize(records, [d.name for d in pool.drafters])
    tasks = list(dict.fromkeys(r.task for r in records))
    print(f"{dtype}, {len(prompts)} prompts ({args.prompts}), {args.max_new_tokens} new tokens")
    print("| cap | " + " | ".join(tasks) + " | overall | τ | near-ties | errors |")
    print("|" + "---|" * (len(tasks) + 5))
    for method, entry in summary.items():
        if method == "autoregressive":
            continue
        o = entry["overall"]
        cells = " | ".join(f"{entry[t]['speedup']:.2f}" for t in tasks)
        print(
            f"| {method} | {cells} | {o['speedup']:.2f} | {o['mean_accepted_tokens']:.2f} | {o['near_ties']} | {o['errors']} |"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "dtype": dtype,
        "caps": args.caps,
        "prompts": str(args.prompts),
        "machine": machine(),
        "summary": summary,
    }
    (args.out / f"{dtype}.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main()
