"""The ``--models qwen`` pool's token recycling table, warmed on Qwen2.5-Coder-1.5B's own answers to training prompts.

A `TokenRecyclingDrafter` learns from every verification pass of a call; shipped warm, it drafts from a pool's first
call. This recipe reads the answers of the pool's corpus (`hf_metasd/data/qwen_corpus`: the 1.5B's greedy float32
answers to the first 16 training prompts of each task, `recipes/pools/build_qwen_corpus.py`), puts each behind its
prompt again (the same `task_split` of ``../shared/data/train``: the dev split and every benchmark prompt kept out),
runs the target once over each prompt + answer (`TokenRecyclingDrafter.warm_start`: its greedy next token after every
position) and writes the table to ``hf_metasd/data/qwen_recycling/table.safetensors`` with a ``table.json`` that says
what it holds. `hf_metasd.benchmark.run.load_pool` gives it to the pool's ``token_recycling`` arm.

    python recipes/pools/build_qwen_recycling.py            # about 5 minutes on 2 cores; needs the Qwen packages
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.report import machine  # noqa: E402
from hf_metasd.benchmark.run import QWEN_CORPUS_DIR, QWEN_RECYCLING_DIR, load_models  # noqa: E402
from hf_metasd.drafters import CorpusDrafter, TokenRecyclingDrafter  # noqa: E402
from recipes.pools.generate_task_outputs import task_split  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402


def warm_sequences(data_dir: Path, tokenizer) -> list[list[int]]:
    """Each corpus answer behind its training prompt: the corpus holds, task by task in `TASKS` order, the answers to
    the first ``per_task[task]["prompts"]`` training prompts of the task (`corpus.json`)."""
    meta = json.loads((QWEN_CORPUS_DIR / "corpus.json").read_text())
    documents = CorpusDrafter.from_folder(QWEN_CORPUS_DIR).index.documents()
    sequences, at = [], 0
    for task in TASKS:
        count = meta["per_task"][task]["prompts"]
        _, train = task_split(data_dir, task, tokenizer, 0, 10, 768)
        for (_, prompt), answer in zip(train[:count], documents[at : at + count], strict=True):
            sequences.append(list(prompt) + list(answer))
        at += count
    if at != len(documents):
        raise SystemExit(f"the corpus holds {len(documents)} answers, but corpus.json accounts for {at}")
    return sequences


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=QWEN_RECYCLING_DIR)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    target, tokenizer = load_models("qwen", "float32", args.threads)
    sequences = warm_sequences(args.data_dir, tokenizer)
    drafter = TokenRecyclingDrafter()
    start = time.perf_counter()
    read = drafter.warm_start(target, sequences)
    seconds = time.perf_counter() - start
    path = drafter.save_table(args.out)
    info = {
        "what": "Qwen2.5-Coder-1.5B-Instruct's greedy next token (float32) after every position of its own answers "
        "to training prompts behind those prompts (the answers of hf_metasd/data/qwen_corpus), "
        "recipes/pools/build_qwen_recycling.py",
        "sequences": len(sequences),
        "positions": read,
        "rows": len(drafter.table),
        "bytes": path.stat().st_size,
        "seconds": round(seconds, 1),
        "machine": machine(),
    }
    (args.out / "table.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))
    return info


if __name__ == "__main__":
    main()
