"""The ``--models qwen`` pool's corpus drafter: Qwen2.5-Coder-1.5B's own greedy answers to the training prompts.

Reads the answers `recipes/pools/generate_task_outputs.py --models qwen` cached (``artifacts/task-outputs-qwen/<task>.pt``:
the 1.5B target's greedy float32 continuations of each task's training prompts, the dev split and every benchmark
prompt kept out) and writes one corpus over every task's answers, ``corpus_all``, in the corpus drafter's binary
form (`CorpusDrafter.save_corpus`: int32 tokens and suffix array) to ``hf_metasd/data/qwen_corpus``, with a
``corpus.json`` that says what it holds. `hf_metasd.benchmark.run.load_pool` adds it to the qwen pool with context
lookup, as the embedded SmolLM2 pool's ``corpus_all``. Run from the repository root (seconds)::

    python recipes/pools/generate_task_outputs.py --models qwen --max-prompts-per-task 16 --max-new-tokens 64 --batch-size 16
    python recipes/pools/build_qwen_corpus.py
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.report import machine  # noqa: E402
from hf_metasd.benchmark.run import QWEN_CORPUS_DIR  # noqa: E402
from hf_metasd.drafters import CorpusDrafter  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--outputs", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs-qwen")
    p.add_argument("--out", type=Path, default=QWEN_CORPUS_DIR)
    args = p.parse_args(argv)
    documents, per_task = [], {}
    for task in TASKS:
        path = args.outputs / f"{task}.pt"
        if not path.is_file():
            raise SystemExit(
                f"`--outputs` must hold {task}.pt, but {path} is missing. Run recipes/pools/generate_task_outputs.py "
                "--models qwen first."
            )
        store = torch.load(path)
        documents += store["outputs"]
        per_task[task] = {"prompts": len(store["prompts"]), "tokens": sum(len(o) for o in store["outputs"])}
    drafter = CorpusDrafter.from_sequences(documents, name="corpus_all")
    file = drafter.save_corpus(args.out)
    record = {
        "what": "Qwen2.5-Coder-1.5B-Instruct's greedy float32 answers to ../shared/data/train prompts (dev split and "
        "benchmark prompts kept out), recipes/pools/generate_task_outputs.py --models qwen",
        "per_task": per_task,
        "tokens": sum(t["tokens"] for t in per_task.values()),
        "bytes": file.stat().st_size,
        "commit": machine()["commit"],
        "command": "python recipes/pools/build_qwen_corpus.py " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    (args.out / "corpus.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    main()
