"""Choosing among model-free drafters round by round, against one merged corpus: exact greedy replay on dev prompts.

For every dev prompt (the split of `recipes/pools/acceptance_matrix.py`, whose cached target answers it reads) and every
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

    python recipes/pools/acceptance_matrix.py --context-lookup --models general corpus_mt_bench ... --out artifacts/acceptance-ctx
    python recipes/studies/model_free_selection.py --answers artifacts/acceptance-ctx/dev_answers_new64_val10.pt
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.drafters import CorpusDrafter  # noqa: E402
from recipes.pools.acceptance_matrix import fixed_rounds  # noqa: E402

#: candidate (proposal, match length, support, accepted) -> sort key of a rule (the largest wins)
RULES: dict[str, Callable[[tuple], tuple]] = {
    "oracle": lambda c: (c[3],),
    "longest_match": lambda c: (c[1] if c[0] else -1,),
    "match_then_support": lambda c: (c[1] if c[0] else -1, c[2]),
    "longest_proposal": lambda c: (len(c[0]), c[1]),
}


@torch.no_grad()
def candidate_table(arms, prompt: list[int], answer: list[int], n: int) -> list[list[tuple]]:
    """For every position t of `answer` and every arm: (proposal, match length, support, accepted) after
    prompt + answer[:t], each arm drafting once (match length and support 0 for prompt lookup)."""
    table = []
    for t in range(len(answer)):
        budget = min(n, len(answer) - t - 1)
        row = []
        for drafter in arms:
            proposal = drafter.draft(torch.tensor([prompt + answer[:t]]), budget)[0][0].tolist() if budget > 0 else []
            a = 0
            while a < len(proposal) and proposal[a] == answer[t + a]:
                a += 1
            row.append((proposal, getattr(drafter, "last_match_length", 0), getattr(drafter, "last_support", 0), a))
        table.append(row)
    return table


def tokens_per_round(tables: list[list[list[tuple]]], pick: Callable[[list[tuple]], tuple], n: int) -> float:
    """Mean tokens per round (accepted + 1) when `pick` chooses each round's candidate (`fixed_rounds`' walk)."""
    rounds = tokens = 0
    for table in tables:
        chosen = [pick(row) if row else ((), 0, 0, 0) for row in table]
        rounds += fixed_rounds([(len(c[0]), c[3], 0.0) for c in chosen], n)[0]
        tokens += len(table)
    return tokens / rounds


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--answers",
        type=Path,
        default=REPO_ROOT / "artifacts" / "acceptance-ctx" / "dev_answers_new64_val10.pt",
        help="the target's dev answers cached by recipes/pools/acceptance_matrix.py",
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
    result: dict[str, dict[str, float]] = {}
    for task, pairs in store.items():
        tables = [candidate_table([*arms, merged], prompt, answer, n) for prompt, answer in pairs]
        row = {
            drafter.name: tokens_per_round(tables, lambda r, i=i: r[i], n) for i, drafter in enumerate([*arms, merged])
        }
        for rule, key in RULES.items():
            row[rule] = tokens_per_round(tables, lambda r, key=key: max(r[: len(arms)], key=key), n)
        row["best_single"] = max(row[arm.name] for arm in arms)
        result[task] = row
        print(f"{task:<15}" + " ".join(f"{k}={v:.2f}" for k, v in row.items()), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2, sort_keys=True))
    return result


if __name__ == "__main__":
    main()
