"""Where bfloat16 MetaSD (and transformers' prompt lookup) leave plain bfloat16 greedy output, and how big bfloat16's
rounding of the logits is: the measurements behind `hf_metasd.lossless`'s near-tie tolerance.

For each dev prompt (never benchmark prompts): plain greedy, MetaSD with the embedded pool, and transformers' prompt
lookup (10 tokens), all in bfloat16; each divergence classified by `hf_metasd.lossless.check_divergence`; and along
plain's own output, per position, epsilon = max_v |z_bf16(v) - z_fp32(v)| (teacher-forced passes over the same
tokens), in logits and in units of bfloat16 rounding (2**-8) of the largest logit.

    python recipes/pools/export_dev_prompts.py --out artifacts/dev_prompts.jsonl
    python recipes/studies/near_ties.py --prompts artifacts/dev_prompts.jsonl --per-task 3 --out docs/assets/bench/near_ties.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=Path, required=True)
    p.add_argument("--per-task", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "near_ties.json")
    args = p.parse_args(argv)
    import torch

    import hf_metasd
    from hf_metasd.benchmark.offline import chat_prompt, load_default_target, load_embedded_pool
    from hf_metasd.benchmark.prompts import load_prompts_file
    from hf_metasd.lossless import check_divergence

    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(torch.bfloat16)
    target32, _ = load_default_target(torch.float32)
    pool = load_embedded_pool(target)
    prompts = load_prompts_file(args.prompts, None, args.per_task)
    common = {"do_sample": False, "max_new_tokens": args.max_new_tokens, "min_new_tokens": args.max_new_tokens}
    common["pad_token_id"] = tokenizer.pad_token_id
    methods = {
        "metasd": {"custom_generate": hf_metasd.generate, "assistant_models": pool},
        "prompt_lookup": {"prompt_lookup_num_tokens": 10},
    }
    divergences, epsilon, units = [], [], []
    for prompt in prompts:
        ids = chat_prompt(tokenizer, prompt.text)
        plain = target.generate(ids, **common)
        with torch.no_grad():
            z16 = target(plain).logits[0, ids.shape[1] - 1 : -1].float()
            z32 = target32(plain).logits[0, ids.shape[1] - 1 : -1].float()
        eps = (z16 - z32).abs().max(-1).values
        epsilon += eps.tolist()
        units += (eps / (z32.abs().max(-1).values * 2.0**-8)).tolist()
        for name, kwargs in methods.items():
            out = target.generate(ids, **common, **kwargs)
            found = check_divergence(target, plain, out, ids.shape[1], target_float32=target32)
            divergences.append({"method": name, "prompt": prompt.id, "divergence": found and found.to_dict()})
            print(name, prompt.id, "identical" if found is None else found.describe(tokenizer), flush=True)

    def quantiles(values: list[float]) -> dict[str, float]:
        values = sorted(values)
        return {
            "median": statistics.median(values),
            "p99": values[int(0.99 * (len(values) - 1))],
            "max": values[-1],
        }

    result = {
        "prompts": f"{args.prompts}, {args.per_task} per task ({len(prompts)})",
        "max_new_tokens": args.max_new_tokens,
        "epsilon_logits": quantiles(epsilon),
        "epsilon_in_bf16_units_of_max_logit": quantiles(units),
        "positions": len(epsilon),
        "divergences": divergences,
    }
    for name in methods:
        rows = [d for d in divergences if d["method"] == name]
        left = [d["divergence"] for d in rows if d["divergence"] is not None]
        result[name] = {
            "outputs": len(rows),
            "diverged": len(left),
            "near_ties": sum(d["near_tie"] for d in left),
            "largest_gap": max((abs(d["gap"]) for d in left), default=0.0),
            "smallest_tolerance": min((d["tolerance"] for d in left), default=None),
        }
        print(name, result[name])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))
    main()
