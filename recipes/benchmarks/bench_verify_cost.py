"""Cost of one target forward pass with a KV cache, by number of new tokens (the verification of N drafted tokens
feeds N + 1): median of repeated runs after a prefill of `--context` tokens (64 by default; Spec-Bench's
summarization and RAG prompts are 500-800 tokens long), SmolLM2-135M-Instruct (``--models qwen``: Qwen2.5-Coder-1.5B,
the target of `hf-metasd bench --models qwen`), fp32, 2 threads.

Two columns: transformers' own kernels, and the same pass under `hf_metasd.kernels.skinny_linear` (what
`hf_metasd.generate` uses for the target's verification passes on CPU). On the 2-core CPU of the benchmark, MKL's
float32 GEMM makes 2-8 tokens cost 1.4-2x one token; the transposed product brings 2-5 tokens to about one token's
cost. The printed table is what `num_assistant_tokens` should be chosen from on a given machine.

    python recipes/benchmarks/bench_verify_cost.py
    python recipes/benchmarks/bench_verify_cost.py --context 64 700 --tokens 1 4   # does a long context change the ratio?
    python recipes/benchmarks/bench_verify_cost.py --models qwen --tokens 1 2 3 4 --reps 6
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import DynamicCache

from hf_metasd.benchmark.run import load_models
from hf_metasd.kernels import skinny_linear


def forward_ms(model, prompt: torch.Tensor, num_tokens: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            model(input_ids=prompt, cache=cache, use_cache=True, logits_to_keep=1)
            new = torch.randint(100, 1000, (1, num_tokens))
            start = time.perf_counter()
            model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=num_tokens)
            times.append(time.perf_counter() - start)
    times.sort()
    return 1000 * times[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="*", default=[1, 2, 3, 4, 5, 6, 7, 8, 9, 11])
    parser.add_argument("--reps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--context", type=int, nargs="*", default=[64], help="prefill lengths to measure after")
    parser.add_argument("--models", default="smollm2", choices=["smollm2", "qwen"], help="the target (as `hf-metasd`)")
    args = parser.parse_args()
    model, _ = load_models(args.models, args.dtype, args.threads)
    print("context | new tokens | ms per forward | x one token | skinny_linear ms | x one token")
    for length in args.context:
        prompt = torch.randint(100, 1000, (1, length))
        base = forward_ms(model, prompt, 1, args.reps)
        for n in args.tokens:
            ms = base if n == 1 else forward_ms(model, prompt, n, args.reps)
            with skinny_linear(model):
                skinny = forward_ms(model, prompt, n, args.reps)
            print(
                f"{length:>7} | {n:>10} | {ms:>14.1f} | {ms / base:>11.2f} | {skinny:>16.1f} | {skinny / base:>11.2f}"
            )


if __name__ == "__main__":
    main()
