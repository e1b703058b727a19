"""Choosing among model-free drafters round by round, against one merged corpus: exact greedy replay on dev prompts.

For every dev prompt (the split of `recipes/acceptance_matrix.py`, whose cached target answers it reads) and every
round of greedy speculative decoding with draft length N, every model-free arm of the pool (its corpus drafters and
prompt lookup) proposes after the same prefix, and the round accepts the common prefix of the chosen proposal and the
target's answer. Rules compared, in mean tokens per round (accepted + 1):

* each arm alone (the per-task best of them is the oracle a bandit over these arms can at most reach);
* ``oracle``: the proposal that would be accepted most (an upper bound, not a rule);
* ``longest_match``: the proposal whose match with its corpus or the context is the longest (`last_match_length`),
  ``match_then_support``: ties broken by the number of occurrences (`last_support`), ``longest_proposal``;
* ``merged``: one `CorpusDrafter` over the documents of every corpus of the pool, with context lookup (the longest
  match over all of them, equal ones voting together: SuffixDecoding's single global tree).

No target runs (the answers are cached), no timing: the figures are tokens per round, the same on every machine.

    python recipes/acceptance_matrix.py --context-lookup --models general corpus_mt_bench ... --out artifacts/acceptance-ctx
    python recipes/model_free_selection.py --answers artifacts/acceptance-ctx/dev_answers_new64_val10.pt
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool
from hf_metasd.drafters import CorpusDrafter

REPO_ROOT = Path(__file__).resolve().parent.parent

#: (name, arm, proposal, match length, support, accepted) -> sort key of a rule (the largest wins)
RULES: dict[str, Callable[[tuple], tuple]] = {
    "oracle": lambda c: (c[5],),
    "longest_match": lambda c: (c[3] if c[2] else -1,),
    "match_then_support": lambda c: (c[3] if c[2] else -1, c[4]),
    "longest_proposal": lambda c: (len(c[2]), c[3]),
}


def accepted(proposal: list[int], answer: list[int], t: int) -> int:
    """Greedy decoding keeps the common prefix of the proposal and the target's answer from position `t`."""
    a = 0
    while a < len(proposal) and proposal[a] == answer[t + a]:
        a += 1
    return a


def candidates(arms, context: list[int], budget: int) -> list[tuple]:
    """Every arm's proposal after `context`, with its match length and support (0 for prompt lookup)."""
    out = []
    for i, drafter in enumerate(arms):
        tokens, _ = drafter.draft(torch.tensor([context]), budget)
        out.append(
            (
                drafter.name,
                i,
                tokens[0].tolist(),
                getattr(drafter, "last_match_length", 0),
                getattr(drafter, "last_support", 0),
            )
        )
    return out


def replay(pairs, choose: Callable[[list[int], int, list[int]], int], n: int) -> float:
    """Mean tokens per round when `choose(context, budget, answer_from_t)` gives each round's accepted count."""
    rounds = tokens = 0
    for prompt, answer in pairs:
        t = 0
        while t < len(answer):
            budget = min(n, len(answer) - t - 1)
            a = choose(prompt + answer[:t], budget, answer, t) if budget > 0 else 0
            rounds += 1
            t += a + 1
        tokens += len(answer)
    return tokens / rounds


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--answers",
        type=Path,
        default=REPO_ROOT / "artifacts" / "acceptance-ctx" / "dev_answers_new64_val10.pt",
        help="the target's dev answers cached by recipes/acceptance_matrix.py",
    )
    p.add_argument("--num-assistant-tokens", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    args = p.parse_args(argv)
    store = torch.load(args.answers)
    target, _ = load_default_target(torch.float32)
    arms = [d.spawn(target) for d in load_embedded_pool(target).drafters if d.kind in ("corpus", "prompt_lookup")]
    documents = [doc for d in arms if isinstance(d, CorpusDrafter) for doc in d.index.documents()]
    merged = CorpusDrafter.from_sequences(documents, name="merged", context_lookup=True).spawn(target)
    n = args.num_assistant_tokens
    table: dict[str, dict[str, float]] = {}
    for task, pairs in store.items():
        row = {}
        for arm in arms:
            row[arm.name] = replay(
                pairs, lambda c, b, y, t, d=arm: accepted(d.draft(torch.tensor([c]), b)[0][0].tolist(), y, t), n
            )
        for rule, key in RULES.items():

            def choose(context, budget, answer, t, key=key):
                scored = [(*c, accepted(c[2], answer, t)) for c in candidates(arms, context, budget)]
                return max(scored, key=key)[5]

            row[rule] = replay(pairs, choose, n)
        row["merged"] = replay(
            pairs, lambda c, b, y, t: accepted(merged.draft(torch.tensor([c]), b)[0][0].tolist(), y, t), n
        )
        row["best_single"] = max(row[arm.name] for arm in arms)
        table[task] = row
        print(f"{task:<15}" + " ".join(f"{k}={v:.2f}" for k, v in row.items()), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(table, indent=2, sort_keys=True))
    return table


if __name__ == "__main__":
    main()
