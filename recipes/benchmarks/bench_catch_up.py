"""Catch-up cost of switching drafters every round (``round_robin``) vs never switching (``fixed``).

A drafter that did not draft the previous rounds must ingest the tokens it has not seen before it drafts (one forward
pass over them, with its own KV cache). MetaSD's telemetry (`MetaSDStats`, ``out.metasd`` with
``return_dict_in_generate=True``) books that time as ``catch_up_seconds`` (including each drafter's first prefill of
the prompt) and the rest as ``draft_seconds`` / ``verify_seconds``. This script reports the catch-up share of the
wall time of `generate` for two pools:

* ``early_exit``: the target's own first 2, 4, 6 and 8 layers (weights shared with the target);
* ``lora``: 5 LoRA arms (r=16, 7 projections) on one 2-layer early-exit base of the target.

Run from the repository root::

    python recipes/benchmarks/bench_catch_up.py                     # SmolLM2-135M-Instruct target (hf_metasd.benchmark.offline), fp32
    python recipes/benchmarks/bench_catch_up.py --target synthetic  # a random SmolLM2-shaped 8-layer target, no weights needed
"""

from __future__ import annotations

import argparse
import time

import torch

import hf_metasd
from hf_metasd.drafters import EarlyExitDrafter, LoraDrafter, early_exit_model

TEXTS = (
    "Explain in three sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarise the plot of Romeo and Juliet for a ten-year-old.",
)


def load_target(kind: str):
    if kind == "smollm2":
        from hf_metasd.benchmark.offline import chat_prompt, load_default_target

        target, tokenizer = load_default_target(torch.float32)
        return target.eval(), [chat_prompt(tokenizer, t) for t in TEXTS]
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    target = LlamaForCausalLM(config).eval()
    target.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(0)
    return target, [torch.randint(0, config.vocab_size, (1, 40), generator=g) for _ in TEXTS]


def build_pools(target) -> dict[str, tuple[list, int]]:
    """pool name -> (drafters, arm used by `fixed`)."""
    from peft import LoraConfig, get_peft_model

    early = [EarlyExitDrafter(target, num_layers=k) for k in (2, 4, 6, 8)]
    lora = LoraConfig(
        r=16,
        lora_alpha=32,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
    peft_model = get_peft_model(early_exit_model(target, 2), lora, adapter_name="task0")
    for i in range(1, 5):
        peft_model.add_adapter(f"task{i}", lora)
    return {"early_exit": (early, 1), "lora": (LoraDrafter.from_peft_model(peft_model.eval()), 0)}


def run(target, prompts, drafters, policy: str, arm: int, max_new_tokens: int, num_assistant_tokens: int) -> dict:
    totals = dict.fromkeys(("wall", "catch_up", "draft", "verify"), 0.0)
    totals.update(dict.fromkeys(("rounds", "tokens", "catch_up_tokens", "switches"), 0))
    for prompt in prompts:
        start = time.perf_counter()
        out = target.generate(
            prompt,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            custom_generate=hf_metasd.generate,
            assistant_models=drafters,
            meta_policy=policy,
            meta_policy_kwargs={"arm": arm} if policy == "fixed" else None,
            num_assistant_tokens=num_assistant_tokens,
            return_dict_in_generate=True,
        )
        totals["wall"] += time.perf_counter() - start
        stats = out.metasd
        totals["catch_up"] += stats.catch_up_seconds
        totals["draft"] += stats.draft_seconds
        totals["verify"] += stats.verify_seconds
        totals["rounds"] += stats.rounds
        totals["tokens"] += out.sequences.shape[1] - prompt.shape[1]
        switched = [i for i in range(1, stats.rounds) if stats.arms[i] != stats.arms[i - 1]]
        totals["switches"] += len(switched)
        totals["catch_up_tokens"] += sum(stats.catch_up_tokens[i] for i in switched)
    return totals


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=("smollm2", "synthetic"), default="smollm2")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-assistant-tokens", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, prompts = load_target(args.target)
    print(
        f"target={args.target} ({target.config.num_hidden_layers} layers), {len(prompts)} prompts x "
        f"{args.max_new_tokens} new tokens, N={args.num_assistant_tokens}, {args.threads} threads"
    )
    header = (
        f"{'pool':<11}{'policy':<12}{'rounds':>7}{'tok/s':>7}{'wall s':>8}{'catch-up s':>11}{'share':>7}"
        f"{'draft s':>8}{'verify s':>9}{'tok/switch':>11}"
    )
    print(header)
    for name, (drafters, arm) in build_pools(target).items():
        run(target, prompts[:1], drafters, "round_robin", arm, 8, args.num_assistant_tokens)  # warm-up
        for policy in ("fixed", "round_robin"):
            t = run(target, prompts, drafters, policy, arm, args.max_new_tokens, args.num_assistant_tokens)
            per_switch = t["catch_up_tokens"] / t["switches"] if t["switches"] else 0.0
            print(
                f"{name:<11}{policy:<12}{t['rounds']:>7}{t['tokens'] / t['wall']:>7.1f}{t['wall']:>8.2f}"
                f"{t['catch_up']:>11.3f}{t['catch_up'] / t['wall']:>7.1%}{t['draft']:>8.2f}{t['verify']:>9.2f}"
                f"{per_switch:>11.1f}"
            )


if __name__ == "__main__":
    main()
