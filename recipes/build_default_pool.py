"""Build the embedded pool shipped in `hf_metasd/data/pools/smollm2-135m-tasks` from trained drafters.

Input: the folder written by `recipes/train_drafters.py` (`base/` without embeddings, `head_token_ids.json`,
`adapters/<task>/`). Output: a `DrafterPool` folder (`config.json`, model card, weights) holding, in arm order,

* one LoRA arm per task (`mt_bench`, `translation`, `summarization`, `qa`, `math_reasoning`, `rag`, `code`) on one
  shared 2-layer base in bfloat16 that borrows the target's embedding and restricts its LM head,
* the shared base alone (`general`),
* prompt lookup (model-free),
* early-exit self-drafting from the target's first `--early-exit-layers` layers (same restricted head).

The pool is loaded back, checked to be lossless on a few benchmark prompts, and its size is printed.

    python recipes/train_drafters.py --max-prompts-per-task 256 --out artifacts/smollm2-drafters-256
    python recipes/build_default_pool.py --drafters artifacts/smollm2-drafters-256
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

import hf_metasd
from hf_metasd.benchmark.offline import chat_prompt, embedded_pool_path, load_default_target
from hf_metasd.benchmark.prompts import BENCH_TASKS, load_bench_prompts
from hf_metasd.pool import DrafterPool, DrafterPoolConfig, DrafterSpec


def folder_size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def dedupe_general(out: Path) -> None:
    """`general` is the LoRA arms' base: point its entry at that folder instead of storing the weights twice."""
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    lora = next(d for d in config["drafters"] if d["kind"] == "lora")
    general = next(d for d in config["drafters"] if d["name"] == "general")
    shutil.rmtree(out / general["path"])
    general["path"] = f"{lora['path']}/{lora['params']['base']}"
    general["params"]["head_token_ids"] = lora["params"]["head_token_ids"]
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafters", default="artifacts/smollm2-drafters-256", help="output of train_drafters.py")
    parser.add_argument("--out", default=str(embedded_pool_path()))
    # defaults chosen on development prompts (never the benchmark's) by recipes/tune_policy.py
    parser.add_argument("--num-assistant-tokens", type=int, default=3)
    parser.add_argument("--beta", type=float, default=0.05, help="UCB exploration weight of the pool's policy")
    parser.add_argument("--early-exit-layers", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16", help="dtype of the trained drafters")
    args = parser.parse_args()

    source = Path(args.drafters)
    target, tokenizer = load_default_target(torch.float32)
    with tempfile.TemporaryDirectory() as staging:
        staging = Path(staging)
        shutil.copytree(source / "base", staging / "base")
        shutil.copytree(source / "adapters", staging / "adapters")
        shutil.copy(source / "head_token_ids.json", staging / "head_token_ids.json")
        tasks = [t for t in BENCH_TASKS if (source / "adapters" / t).is_dir()]
        head = "head_token_ids.json"
        drafters = [
            DrafterSpec(
                kind="lora",
                name="smollm2-135m-task-drafters",
                path=".",
                stored=True,
                adapters=tasks,
                params={
                    "base": "base",
                    "adapters_dir": "adapters",
                    "head_token_ids": head,
                    "share_target_embeddings": True,
                    "dtype": args.dtype,
                },
            ),
            # the shared base alone: at this data size it agrees with the target as well as any task adapter, and it
            # runs without the LoRA overhead
            DrafterSpec(
                kind="assistant_model",
                name="general",
                path="base",
                stored=True,
                params={"head_token_ids": head, "share_target_embeddings": True, "dtype": args.dtype},
            ),
            DrafterSpec(kind="prompt_lookup", name="prompt_lookup", params={"max_matching_ngram_size": 2}),
            DrafterSpec(
                kind="early_exit",
                name=f"early_exit_{args.early_exit_layers}",
                params={"num_layers": args.early_exit_layers, "head_token_ids": head},
            ),
        ]
        DrafterPoolConfig(
            drafters=drafters,
            target="HuggingFaceTB/SmolLM2-135M-Instruct",
            policy="ucb",
            policy_kwargs={"beta": args.beta},
            reward="bd",
            num_assistant_tokens=args.num_assistant_tokens,
        ).save(staging)
        pool = DrafterPool.from_pretrained(staging, target=target)
        out = Path(args.out)
        if out.exists():
            shutil.rmtree(out)
        pool.save_pretrained(out, store_weights=True)
    dedupe_general(out)

    pool = DrafterPool.from_pretrained(out, target=target)
    print(repr(pool))
    for prompt in load_bench_prompts(per_task=1)[:3]:
        ids = chat_prompt(tokenizer, prompt.text)
        reference = target.generate(ids, do_sample=False, max_new_tokens=24)
        got = target.generate(
            ids, do_sample=False, max_new_tokens=24, custom_generate=hf_metasd.generate, assistant_models=pool
        )
        if not torch.equal(got, reference):
            raise RuntimeError(f"the pool changed the greedy output on {prompt.id}: not shipping it")
    config = json.loads((out / "config.json").read_text())
    print(
        f"wrote {out}: {len(pool)} arms, {folder_size_mb(out):.2f} MB, config drafters: "
        f"{[d['name'] for d in config['drafters']]}; lossless on 3 benchmark prompts"
    )


if __name__ == "__main__":
    main()
