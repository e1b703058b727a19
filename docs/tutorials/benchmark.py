"""The benchmark machinery of `hf-metasd bench`, on tiny models: methods, interleaved runs, report and plots.

`hf-metasd bench` does the same with the embedded target (SmolLM2-135M-Instruct), the shipped pool and the Spec-Bench
+ HumanEval prompts. This script only shows how the pieces fit and what the outputs look like; tiny random models say
nothing about real speedups. Run it from the repository root: ``python docs/tutorials/benchmark.py`` (needs
``pip install hf-metasd[bench]`` for the plots).
"""

import json
import tempfile
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_metasd.benchmark.methods import build_methods
from hf_metasd.benchmark.prompts import BenchPrompt
from hf_metasd.benchmark.report import write_report
from hf_metasd.benchmark.run import run_bench
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter

torch.set_num_threads(1)


def tiny_llama(seed: int, layers: int) -> LlamaForCausalLM:
    """A random Llama with hidden size 32 and a 96-token vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.generation_config.eos_token_id = None
    return model


# --8<-- [start:setup]
target = tiny_llama(0, layers=2)
# Drafters named after tasks: the report's `best_arm_ratio` is the share of rounds drafted by the prompt's own drafter,
# and `oracle` is "always the prompt's own drafter" (built from the `fixed[<task>]` runs).
drafters = [ModelDrafter(tiny_llama(1, layers=1), name="qa"), PromptLookupDrafter(name="rag")]
prompts = [
    BenchPrompt("qa", "demo/qa-1", "What is speculative decoding?"),
    BenchPrompt("rag", "demo/rag-1", "Context: the cat sat on the mat. The cat sat. Question: where did the cat sit?"),
]


def encode(tokenizer, text: str) -> torch.Tensor:
    """Stands in for the chat template of a real tokenizer."""
    return torch.tensor([[1 + ord(c) % 95 for c in text[:32]]])


methods = build_methods(drafters, num_assistant_tokens=4, policies=[("ucb-bd", "ucb", "bd"), ("ucb-be", "ucb", "be")])
print("methods:", [m.name for m in methods])
# --8<-- [end:setup]

# --8<-- [start:run]
records = run_bench(target, None, prompts, methods, max_new_tokens=24, progress=False, encode=encode)
assert all(r.identical for r in records), "every method must reproduce autoregressive greedy output"
with tempfile.TemporaryDirectory() as out:
    report = write_report(records, [d.name for d in drafters], out, meta={"note": "tiny models, docs tutorial"})
    print(sorted(p.name for p in Path(out).iterdir()))
    print((Path(out) / "results.md").read_text())
    results = json.loads((Path(out) / "results.json").read_text())
    print("machine:", {k: results["meta"]["machine"][k] for k in ("cpu_count", "torch", "transformers", "commit")})
# --8<-- [end:run]
