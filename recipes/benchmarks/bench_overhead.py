"""MetaSD's own overhead, measured in one run on one machine (issue: MetaSD core, item 8).

1. One drafter: wall time of MetaSD (`custom_generate=hf_metasd.generate`, one drafter) vs transformers' own
   assisted generation (`assistant_model=`) with the same drafter, the same prompts, the same draft length (constant
   schedule, confidence-based early stop off so both draft exactly `N` tokens), greedy; ratio < 1 means MetaSD is
   faster. Plain `generate` is timed too, for the speedups.
2. Three drafters (UCB with BD): share of wall time spent in selection (policy), reward and catch-up (ingesting
   tokens a drafter missed while others drafted; each drafter's prompt prefill is reported apart).

The target is the embedded default (SmolLM2-135M-Instruct, `hf_metasd.benchmark.offline`); drafters are its first k layers
copied into separate small models (real weights, low acceptance: this measures machinery, not drafter quality).
Methods are interleaved prompt by prompt so that machine noise hits them alike; every output is checked against
plain greedy.

    python recipes/benchmarks/bench_overhead.py --prompts 8 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
from tqdm.auto import tqdm
from transformers import AutoModelForCausalLM

import hf_metasd
from hf_metasd.benchmark.offline import chat_prompt, load_default_target
from hf_metasd.benchmark.prompts import load_bench_prompts, mixed_stream


def truncated_copy(target, num_layers: int):
    """A separate model holding a copy of the target's first `num_layers` layers, norm and head."""
    config = target.config.__class__(**{**target.config.to_dict(), "num_hidden_layers": num_layers})
    model = AutoModelForCausalLM.from_config(config, dtype=target.dtype)
    state = {
        k: v
        for k, v in target.state_dict().items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    model.load_state_dict(state, strict=False)
    model.generation_config.num_assistant_tokens_schedule = "constant"
    model.generation_config.assistant_confidence_threshold = 0.0
    model.name_or_path = f"{target.name_or_path or 'target'}[:{num_layers}]"
    return model.eval()


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="prompts, interleaved over Spec-Bench tasks")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-assistant-tokens", type=int, default=5)
    parser.add_argument("--layers", type=int, nargs=3, default=[2, 4, 6], help="depths of the three drafters")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the numbers as JSON here")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target, tokenizer = load_default_target(torch.float32)
    drafters = [truncated_copy(target, k) for k in args.layers]
    single = drafters[0]
    n = args.num_assistant_tokens
    prompts = mixed_stream(load_bench_prompts(per_task=max(1, args.prompts // 7 + 1)))[: args.prompts]
    common = {"do_sample": False, "max_new_tokens": args.max_new_tokens}

    times = {"plain": [], "transformers_assisted": [], "metasd_1": [], "metasd_3": []}
    stats3 = []
    warm = chat_prompt(tokenizer, "Hello")
    target.generate(warm, **common)
    target.generate(warm, custom_generate=hf_metasd.generate, assistant_models=[single], **common)
    for prompt in tqdm(prompts, desc="prompts"):
        ids = chat_prompt(tokenizer, prompt.text)
        reference, t = timed(target.generate, ids, **common)
        times["plain"].append(t)
        out, t = timed(target.generate, ids, assistant_model=single, num_assistant_tokens=n, **common)
        times["transformers_assisted"].append(t)
        assert torch.equal(out, reference), "transformers' assisted generation changed the output"
        metasd = {"custom_generate": hf_metasd.generate, "num_assistant_tokens": n, **common}
        out, t = timed(target.generate, ids, assistant_models=[single], **metasd)
        times["metasd_1"].append(t)
        assert torch.equal(out, reference), "MetaSD (1 drafter) changed the output"
        out, t = timed(target.generate, ids, assistant_models=drafters, return_dict_in_generate=True, **metasd)
        times["metasd_3"].append(t)
        assert torch.equal(out.sequences, reference), "MetaSD (3 drafters) changed the output"
        stats3.append(out.metasd)

    total = {k: sum(v) for k, v in times.items()}
    wall3 = total["metasd_3"]
    policy = sum(s.policy_seconds for s in stats3)
    reward = sum(s.reward_seconds for s in stats3)
    catch_up = sum(s.catch_up_seconds for s in stats3)
    prefill = sum(s.prefill_seconds for s in stats3)
    result = {
        "machine": f"{platform.machine()} {platform.processor() or ''} torch {torch.__version__} threads {args.threads}",
        "target": "SmolLM2-135M-Instruct fp32",
        "drafters": [d.name_or_path for d in drafters],
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "num_assistant_tokens": n,
        "seconds": total,
        "ratio_metasd1_over_transformers_assisted": total["metasd_1"] / total["transformers_assisted"],
        "per_prompt_ratio_median": statistics.median(
            a / b for a, b in zip(times["metasd_1"], times["transformers_assisted"])
        ),
        "speedup_vs_plain": {k: total["plain"] / v for k, v in total.items()},
        "metasd_3_share": {
            "policy": policy / wall3,
            "reward": reward / wall3,
            "catch_up": catch_up / wall3,
            "policy+reward": (policy + reward) / wall3,
            "policy+reward+catch_up": (policy + reward + catch_up) / wall3,
            "drafters_prompt_prefill": prefill / wall3,
        },
        "metasd_3_pulls": [sum(s.pulls[i] for s in stats3) for i in range(len(drafters))],
        "all_outputs_identical_to_plain_greedy": True,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
