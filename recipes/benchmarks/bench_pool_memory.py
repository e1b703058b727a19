"""Resident memory of K LoRA drafters on one base vs K separate copies of the base.

Each scenario runs in its own subprocess (fresh allocator), builds its drafters from a SmolLM2-like config (random
weights: memory does not depend on their values), runs one round (catch-up on a 64-token prompt + 4 drafted tokens)
with every arm so that KV caches exist, and reports:

* ``rss_mb``: growth of the process's resident set size over the baseline (torch + transformers imported);
* ``param_mb``: bytes of distinct parameter tensors the drafters hold (shared tensors counted once).

Run from the repository root::

    python recipes/benchmarks/bench_pool_memory.py            # K=5, d=576, 2 layers, vocab 49,152, LoRA r=16 on 7 projections
    python recipes/benchmarks/bench_pool_memory.py --arms 7 --rank 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SCENARIOS = ("single", "lora", "copies")


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _measure(args: argparse.Namespace) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_metasd.drafters import LoraDrafter, ModelDrafter

    torch.set_num_threads(args.threads)
    config = LlamaConfig(
        vocab_size=49_152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=args.layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    )
    prompt = torch.randint(0, config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    baseline = _rss_mb()
    torch.manual_seed(0)
    if args.scenario == "single":
        drafters = [ModelDrafter(LlamaForCausalLM(config).eval(), name="base")]
    elif args.scenario == "copies":
        drafters = [ModelDrafter(LlamaForCausalLM(config).eval(), name=f"copy{i}") for i in range(args.arms)]
    else:
        lora = LoraConfig(
            r=args.rank,
            lora_alpha=2 * args.rank,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        )
        peft_model = get_peft_model(LlamaForCausalLM(config).eval(), lora, adapter_name="task0")
        for i in range(1, args.arms):
            peft_model.add_adapter(f"task{i}", lora)
        drafters = LoraDrafter.from_peft_model(peft_model.eval())
    built = _rss_mb()
    for drafter in drafters:
        drafter.catch_up(prompt)
        drafter.draft(prompt, 4)
    after_round = _rss_mb()
    tensors = {}
    for drafter in drafters:
        for p in drafter.model.parameters():
            tensors[p.data_ptr()] = p.numel() * p.element_size()
    return {
        "scenario": args.scenario,
        "arms": len(drafters),
        "param_mb": sum(tensors.values()) / 2**20,
        "rss_built_mb": built - baseline,
        "rss_mb": after_round - baseline,
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arms", type=int, default=5)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--scenario", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.scenario:
        print(json.dumps(_measure(args)))
        return []
    rows = []
    for scenario in SCENARIOS:
        cmd = [
            sys.executable,
            __file__,
            "--scenario",
            scenario,
            "--arms",
            str(args.arms),
            "--layers",
            str(args.layers),
        ]
        cmd += ["--rank", str(args.rank), "--threads", str(args.threads)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    single = rows[0]
    print(
        f"SmolLM2-like drafter: d=576, {args.layers} layers, vocab 49152 (tied), fp32; LoRA r={args.rank} x 7 projections"
    )
    print(f"{'scenario':<28}{'arms':>5}{'params MB':>11}{'RSS MB':>9}{'x single (params)':>19}{'x single (RSS)':>16}")
    labels = {
        "single": "1 drafter (the base)",
        "lora": f"{args.arms} LoRA arms on one base",
        "copies": f"{args.arms} copies of the base",
    }
    for row in rows:
        print(
            f"{labels[row['scenario']]:<28}{row['arms']:>5}{row['param_mb']:>11.1f}{row['rss_mb']:>9.1f}"
            f"{row['param_mb'] / single['param_mb']:>19.3f}{row['rss_mb'] / single['rss_mb']:>16.3f}"
        )
    lora = rows[1]
    goal = (
        "met"
        if lora["rss_mb"] <= 1.1 * single["rss_mb"] and lora["param_mb"] <= 1.1 * single["param_mb"]
        else "MISSED"
    )
    print(f"goal (LoRA pool within 1.1x of a single drafter, params and RSS): {goal}")
    return rows


if __name__ == "__main__":
    main()
