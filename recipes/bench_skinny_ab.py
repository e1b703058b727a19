"""`skinny_linear` on and off in one run: MetaSD with one model drafter, same prompt, against plain `generate`.

Greedy, after an untimed warm-up call of each; every output is checked against plain decoding. Default: the `--models qwen` configuration
(Qwen2.5-Coder-1.5B target, the 0.5B as drafter; ~9 GB of RAM, its PyPI packages installed as
`hf_metasd.benchmark.offline.load_qwen_coder` says); `--models smollm2` uses the default target and the embedded pool's
`general` drafter.

    python recipes/bench_skinny_ab.py
    python recipes/bench_skinny_ab.py --models smollm2 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import time

import torch

import hf_metasd
from hf_metasd.benchmark.offline import chat_prompt, load_default_target, load_qwen_coder
from hf_metasd.benchmark.offline import load_embedded_pool as default_pool
from hf_metasd.drafters import ModelDrafter

PROMPT = "Write a Python function that checks whether a string is a palindrome."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen", choices=["qwen", "smollm2"])
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--num-assistant-tokens", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.models == "qwen":
        target, tokenizer = load_qwen_coder("1.5b", torch.float32)
        drafter = ModelDrafter(load_qwen_coder("0.5b", torch.float32)[0], name="qwen2.5-coder-0.5b")
    else:
        target, tokenizer = load_default_target(torch.float32)
        drafter = next(d for d in default_pool(target).drafters if d.name == "general")
    ids = chat_prompt(tokenizer, args.prompt)
    common = {"max_new_tokens": args.max_new_tokens, "do_sample": False}
    metasd = {"custom_generate": hf_metasd.generate, "assistant_models": [drafter]}
    target.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up: first calls pay one-off costs
    target.generate(ids, max_new_tokens=4, do_sample=False, **metasd)
    start = time.perf_counter()
    reference = target.generate(ids, **common)
    plain = time.perf_counter() - start
    print(f"plain generate: {plain:.2f} s")
    for _ in range(args.repeats):
        for skinny in (True, False):
            start = time.perf_counter()
            out = target.generate(
                ids,
                **metasd,
                num_assistant_tokens=args.num_assistant_tokens,
                meta_skinny_gemm=skinny,
                **common,
            )
            seconds = time.perf_counter() - start
            same = torch.equal(out, reference)
            print(f"meta_skinny_gemm={skinny!s:5}: {seconds:.2f} s, {plain / seconds:.2f}x, identical: {same}")
            if not same:
                raise SystemExit("ERROR: the output differs from plain greedy decoding")


if __name__ == "__main__":
    main()
