"""Record, once, what every arm of the ``--models qwen`` pool would draft at every position of the target's answers
to dev prompts, so that policies can be replayed over the recordings in seconds (`recipes/pools/replay_rounds.py`).

For greedy decoding a round is replayed *exactly* from a recording: the target's greedy answer ``y`` to a prompt is
computed once; a round at position ``t`` in which an arm proposes ``d`` tokens after ``prompt + y[:t]`` has the
longest common prefix ``a`` of the proposal and ``y[t:]`` accepted, and the next round starts at ``t + a + 1``. What
a deterministic arm proposes at ``t`` depends only on ``prompt + y[:t]``, so one pass over every position records it
for every policy. This recipe stores, per dev prompt:

* the prompt's ids and the target's greedy answer (float32, `--max-new-tokens`);
* the target's top-`--top-k` next tokens at every position of ``prompt + y`` (one teacher-forced pass), what a
  verification pass tells a drafter that learns from the target's logits (`TokenRecyclingDrafter`) and what the
  replay feeds it;
* for each of the pool's **model** arms (Qwen2.5-Coder-0.5B, in float32 and in int8; the target's tokenizer): its
  greedy next token after every position of ``prompt + y`` (one teacher-forced pass). That is all a greedy round needs: while a greedy draft
  matches ``y`` its context is ``prompt + y[:t + j]``, so the draft at ``t`` is accepted for exactly as many tokens
  as the drafter's next token equals ``y``'s from ``t`` on, and its tokens after the first mismatch are rejected
  whatever they are.

Model-free arms (prompt lookup, corpus drafters, token recycling) are cheap and are run by the replay itself.
Every dev prompt comes from the dev split of ``../shared/data/train`` (`generate_task_outputs.dev_prompts`); no
benchmark prompt is read. Costs are not taken from here (other jobs may share the machine): the replay reads them from
`recipes/benchmarks/bench_verify_cost.py`-style measurements made with nothing else running.

    python recipes/pools/record_rounds.py --per-task 3 --out artifacts/rounds/qwen_dev.pt

Needs the Qwen2.5-Coder packages of ``../shared/MODELS.md`` (about 10 GB of RAM); about an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from recipes.pools.generate_task_outputs import task_split  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402


@torch.no_grad()
def top_k_table(target, ids: list[int], k: int) -> torch.Tensor:
    """``(len(ids), k)`` int32: the target's top-`k` next tokens after every position of `ids` (one pass)."""
    out = target(torch.tensor([ids]), use_cache=False)
    return out.logits[0].topk(k, dim=-1).indices.to(torch.int32)


@torch.no_grad()
def greedy_next(drafter_model, ids: list[int]) -> torch.Tensor:
    """``(len(ids),)`` int32: `drafter_model`'s greedy next token after every position of `ids` (one pass)."""
    out = drafter_model(torch.tensor([ids]), use_cache=False)
    return out.logits[0].argmax(dim=-1).to(torch.int32)


@torch.no_grad()
def _median_seconds(fn, repeats: int) -> float:
    import statistics

    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


@torch.no_grad()
def forward_costs(model, context: list[int], widths: range, repeats: int, *, skinny: bool) -> dict[int, float]:
    """Median seconds of `model`'s forward over ``m`` new tokens (``m`` in `widths`) after `context` (with a cache),
    the cheaper of the stock and the transposed float32 product (`hf_metasd.kernels.skinny_linear`) when `skinny`,
    as MetaSD's per-pass kernel choice keeps the cheaper one."""
    from contextlib import nullcontext

    from transformers import DynamicCache

    from hf_metasd.kernels import skinny_linear

    cache = DynamicCache(config=model.config)
    model(input_ids=torch.tensor([context]), cache=cache, use_cache=True, logits_to_keep=1)
    held = cache.get_seq_length()
    costs = {}
    for m in widths:
        best = float("inf")
        for kernel in (nullcontext, lambda: skinny_linear(model)) if skinny else (nullcontext,):
            new = torch.tensor([context[-m:]])

            def one(new=new):
                model(input_ids=new, cache=cache, use_cache=True, logits_to_keep=new.shape[1])
                cache.crop(held - cache.get_seq_length())  # back to the context (a negative count)

            with kernel():
                one()
                best = min(best, _median_seconds(one, repeats))
        costs[m] = best
    return costs


@torch.no_grad()
def measure_costs(args) -> dict:
    """What `replay_rounds.Costs` reads, measured on this machine (run it with nothing else running)."""
    from hf_metasd.benchmark.run import load_models, load_pool
    from hf_metasd.drafters import ModelDrafter

    target, tokenizer = load_models("qwen", "float32", args.threads)
    pool = load_pool(target, "qwen", tokenizer=tokenizer, drafter_dtype=args.drafter_dtype, priors=False)
    models = {d.name: d.model for d in pool.drafters if isinstance(d, ModelDrafter)}
    _, context = task_split(args.data_dir, "rag", tokenizer, 0, 10, 768)[0][0]
    context = list(context)[:256]

    def prefill(model, n):
        return _median_seconds(lambda: model(input_ids=torch.tensor([context[:n]]), logits_to_keep=1), 3) / n

    out = {
        "verify": forward_costs(target, context, range(1, args.verify_tokens + 1), args.repeats, skinny=True),
        "target_prefill": prefill(target, len(context)),
        "forward": {
            name: forward_costs(m, context, range(1, 17), args.repeats, skinny=True) for name, m in models.items()
        },
        "drafter_prefill": {name: prefill(m, len(context)) for name, m in models.items()},
        "context_tokens": len(context),
    }
    print(out, flush=True)
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument("--per-task", type=int, default=3)
    p.add_argument("--skip", type=int, default=0, help="leave out the first SKIP dev prompts of each task")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--verify-tokens", type=int, default=16, help="longest verification pass --costs-out measures")
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--drafter-dtype", default="float32")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "rounds" / "qwen_dev.pt")
    p.add_argument("--costs-out", type=Path, default=None, help="measure costs instead, write them here (JSON)")
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    if args.costs_out is not None:
        import json

        costs = measure_costs(args)
        args.costs_out.parent.mkdir(parents=True, exist_ok=True)
        args.costs_out.write_text(json.dumps(costs, indent=1))
        return costs

    from hf_metasd.benchmark.run import load_models, load_pool
    from hf_metasd.drafters import ModelDrafter

    torch.set_num_threads(args.threads)
    target, tokenizer = load_models("qwen", "float32", args.threads)
    pool = load_pool(target, "qwen", tokenizer=tokenizer, drafter_dtype=args.drafter_dtype, priors=False)
    models = [d for d in pool.drafters if isinstance(d, ModelDrafter)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    store = torch.load(args.out) if args.out.is_file() else {"prompts": []}
    store["prompts"] = [r for r in store["prompts"] if len(r["answer"]) == args.max_new_tokens]
    for record in store["prompts"]:  # a model arm added to the pool since: its next tokens on the recorded answers
        for d in models:
            if d.name not in record["greedy_next"]:
                record["greedy_next"][d.name] = greedy_next(d.model, record["prompt"] + record["answer"])
    torch.save(store, args.out)
    done = {(r["task"], r["index"]) for r in store["prompts"]}
    for task in TASKS:
        dev, _ = task_split(args.data_dir, task, tokenizer, 0, 10, 768)
        for index in range(args.skip, args.skip + args.per_task):
            if (task, index) in done:
                continue
            _, prompt = dev[index]
            start = time.perf_counter()
            out = target.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=args.max_new_tokens,
                min_new_tokens=args.max_new_tokens,  # as the bench runs every method: no early end of sequence
                pad_token_id=tokenizer.pad_token_id,
            )
            answer = out[0, len(prompt) :].tolist()
            record = {
                "task": task,
                "index": index,
                "prompt": list(prompt),
                "answer": answer,
                "top_k": top_k_table(target, list(prompt) + answer, args.top_k),
                "greedy_next": {d.name: greedy_next(d.model, list(prompt) + answer) for d in models},
            }
            store["prompts"].append(record)
            store["meta"] = {
                "max_new_tokens": args.max_new_tokens,
                "top_k": args.top_k,
            }
            torch.save(store, args.out)
            print(
                f"{task} #{index}: prompt {len(prompt)} tokens, answer {len(answer)}, "
                f"{time.perf_counter() - start:.0f} s",
                flush=True,
            )
    return store


if __name__ == "__main__":
    main()
