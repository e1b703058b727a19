"""Generate the target's own answers to each task's training prompts: the raw material of task corpus drafters.

For every task of ``<data-dir>/train/`` the prompts are shuffled with ``--seed`` (the same list as
``train_drafters.shuffled_prompts``); the first ``--val-prompts`` are the development split and are **never**
generated here, the next ``--max-prompts-per-task`` are answered by the target (greedy, batched with left padding).
Benchmark prompts (Spec-Bench, HumanEval) are never read.

Answers are cached per task in ``--out/<task>.pt`` (``{"prompts": [[ids]], "outputs": [[ids]], "seconds": s, "dtype":
d}``) and extended incrementally, so a larger ``--max-prompts-per-task`` only generates the new prompts; a store is
never extended in another ``--dtype`` than it was made in (bf16 greedy answers drift from fp32 ones after a few dozen
tokens: keep them apart, or start another ``--out``). Run from the repository
root::

    python recipes/pools/generate_task_outputs.py                       # every task (about 1 h on 2 cores, fp32)
    python recipes/pools/generate_task_outputs.py --tasks code --max-prompts-per-task 40
    python recipes/pools/generate_task_outputs.py --models qwen --max-prompts-per-task 16 --max-new-tokens 64 --batch-size 16

``--prompts-store STORE`` answers other prompts instead of the tasks': the first user turn of each conversation of a
store with ``answer_spans`` (`recipes/pools/sharegpt_data.py`'s ``sharegpt.pt``: everything before its first
answer, system turn and assistant header included; `first_turns`), the first ``--max-prompts-per-task`` of them
that fit ``--max-prompt-tokens``, into ``--out/<store name>_own.pt``: the target's own answers to public
conversations' questions, for `train_feature_head.py` (``--tasks ... sharegpt_own --train-only-tasks
sharegpt_own``)::

    python recipes/pools/generate_task_outputs.py --dtype bfloat16 --prompts-store artifacts/sharegpt/sharegpt.pt \
        --max-prompts-per-task 1500 --max-new-tokens 256

``--models qwen`` answers with Qwen2.5-Coder-1.5B-Instruct (the ``--models qwen`` bench's target; its own tokenizer, so
its own dev split) into ``artifacts/task-outputs-qwen`` unless ``--out`` says otherwise: the corpus of the qwen pool's
``corpus_all`` arm (built by `recipes/pools/build_qwen_corpus.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from transformers import DynamicCache  # noqa: E402

from hf_metasd.benchmark.batch import left_pad  # noqa: E402
from hf_metasd.benchmark.run import load_models  # noqa: E402
from recipes.pools.train_drafters import TASKS, shuffled_prompts  # noqa: E402


def task_split(data_dir: Path, task: str, tokenizer, seed: int, val_prompts: int, max_prompt_tokens: int):
    """``(dev, train)`` lists of ``(text, ids)`` for `task`: the first `val_prompts` shuffled prompts, then the rest."""
    pairs = shuffled_prompts(data_dir, task, tokenizer, seed, max_prompt_tokens)
    n_val = min(val_prompts, len(pairs) // 2)
    return pairs[:n_val], pairs[n_val:]


def dev_prompts(data_dir: Path, tokenizer, per_task: int) -> list[torch.Tensor]:
    """The first `per_task` dev prompts of every task as ``(1, L)`` id tensors: the split the dev probes and the qwen
    pool's priors use (seed 0, 10 dev prompts per task, prompts over 768 tokens dropped)."""
    return [
        torch.as_tensor(ids).reshape(1, -1)
        for task in TASKS
        for _, ids in task_split(data_dir, task, tokenizer, 0, 10, 768)[0][:per_task]
    ]


def first_turns(store: dict, max_prompt_tokens: int) -> list[list[int]]:
    """The first user turn of each conversation of `store` (``"prompts"``, ``"outputs"``, ``"answer_spans"``), in
    order: its tokens before the first answer span; turns longer than `max_prompt_tokens` are left out.

    Example:
        >>> store = {"prompts": [[1, 2, 3, 4], [5, 6]], "outputs": [[7], [8, 9]], "answer_spans": [[[2, 5]], [[3, 4]]]}
        >>> first_turns(store, 8), first_turns(store, 2)
        ([[1, 2], [5, 6, 8]], [[1, 2]])
    """
    if not store.get("answer_spans"):
        raise SystemExit(
            f"`--prompts-store` must hold `answer_spans` (a store of sharegpt_data.py), but holds {sorted(store)}. "
            "Pass such a store, or answer the tasks' prompts without `--prompts-store`."
        )
    turns = []
    for prompt, output, spans in zip(store["prompts"], store["outputs"], store["answer_spans"], strict=True):
        first = (list(prompt) + list(output))[: spans[0][0]]
        if len(first) <= max_prompt_tokens:
            turns.append(first)
    return turns


@torch.no_grad()
def generate_continuations(target, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int, eos: int, desc):
    """Greedy continuations, batched with left padding; each stops at (and includes) the first eos.

    Unlike `generate`, a row that finished leaves the batch (its cache rows are dropped), so short answers do not pay
    for the longest one of their batch.
    """
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        ids, mask = left_pad([torch.tensor([prompt_ids[i]], dtype=torch.long) for i in idx], eos)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=target.config)
        logits = target(
            input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True, logits_to_keep=1
        ).logits[:, -1]
        alive = list(idx)
        for step in range(max_new_tokens):
            tokens = logits.argmax(-1)
            done = []
            for row, i in enumerate(alive):
                outputs[i].append(int(tokens[row]))
                if int(tokens[row]) == eos or step == max_new_tokens - 1:
                    done.append(row)
            if len(done) == len(alive):
                break
            if done:
                keep = torch.tensor([r for r in range(len(alive)) if r not in done])
                cache.batch_select_indices(keep)
                mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
                alive = [alive[r] for r in keep.tolist()]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
            positions = positions[:, -1:] + 1
            logits = target(
                input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, cache=cache, use_cache=True
            ).logits[:, -1]
    return outputs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument(
        "--models", default="smollm2", choices=["smollm2", "qwen"], help="the target (as `hf-metasd bench`)"
    )
    p.add_argument("--out", type=Path, default=None, help="default: artifacts/task-outputs (qwen: task-outputs-qwen)")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument(
        "--prompts-store",
        type=Path,
        default=None,
        help="answer the first user turns of this store's conversations (sharegpt_data.py's) instead of the tasks'",
    )
    p.add_argument("--max-prompts-per-task", type=int, default=400)
    p.add_argument("--max-prompt-tokens", type=int, default=768)
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--val-prompts", type=int, default=10, help="development prompts per task, never generated here")
    p.add_argument("--batch-size", type=int, default=48)
    p.add_argument("--chunk", type=int, default=96, help="prompts generated between two saves of the cache")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    todo: dict[str, list] = {}
    if args.prompts_store is not None:  # checked before the target loads
        turns = first_turns(torch.load(args.prompts_store), args.max_prompt_tokens)
        todo[f"{args.prompts_store.stem}_own"] = turns[: args.max_prompts_per_task]
    target, tokenizer = load_models(args.models, args.dtype, args.threads)  # sets torch's threads too
    if args.out is None:
        args.out = (
            REPO_ROOT / "artifacts" / ("task-outputs" if args.models == "smollm2" else f"task-outputs-{args.models}")
        )
    args.out.mkdir(parents=True, exist_ok=True)
    if args.prompts_store is None:
        for task in args.tasks:
            _, train = task_split(args.data_dir, task, tokenizer, args.seed, args.val_prompts, args.max_prompt_tokens)
            todo[task] = [ids for _, ids in train[: args.max_prompts_per_task]]
    stores: dict[str, dict] = {}
    for task in todo:
        path = args.out / f"{task}.pt"
        stores[task] = torch.load(path) if path.is_file() else {"prompts": [], "outputs": [], "seconds": 0.0}
        made_in = stores[task].setdefault("dtype", args.dtype if not stores[task]["prompts"] else "float32")
        if made_in != args.dtype:
            raise SystemExit(
                f"`--dtype` must be the dtype {path} was made in ({made_in}), but is {args.dtype}. "
                "Pass that dtype, or another `--out`."
            )
    # one chunk of every task in turn, so that a partial run already covers every task
    while any(len(stores[t]["prompts"]) < len(todo[t]) for t in todo):
        for task in todo:
            store, done = stores[task], len(stores[task]["prompts"])
            chunk = todo[task][done : done + args.chunk]
            if not chunk:
                continue
            start = time.perf_counter()
            outputs = generate_continuations(
                target, chunk, args.max_new_tokens, args.batch_size, tokenizer.eos_token_id, desc=f"generate {task}"
            )
            store["seconds"] += time.perf_counter() - start
            store["prompts"] += chunk
            store["outputs"] += outputs
            torch.save(store, args.out / f"{task}.pt")
            tokens = sum(len(o) for o in store["outputs"])
            print(
                f"{task}: {len(store['prompts'])}/{len(todo[task])} prompts, {tokens} tokens, "
                f"{tokens / store['seconds']:.0f} tokens/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
