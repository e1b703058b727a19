"""How long a corpus draft should be, by the length of the match it continues: an exact greedy replay on dev answers.

For every position of the default target's greedy dev answers (`acceptance_matrix.dev_answers`: 10 dev prompts per
task from ``../shared/data/train/``, never benchmark prompts, 64 new tokens), the embedded pool's ``corpus_all``
(with its context lookup) proposes `--record-tokens` tokens; greedy verification accepts exactly the common prefix
with the answer. Per match class (`hf_metasd.draft_length.match_class`: 1, 2, 3-4, 5-8, 9-16 tokens) the recipe
reports the rounds, the mean accepted tokens of the full proposal and the draft length that maximises tokens per
second of verification, :math:`(1 + E[\\min(A, n)]) / \\hat v(n + 1)`, with :math:`\\hat v` a straight line fitted
to the verification costs measured here (`acceptance_matrix.verify_costs`). It then replays speculative decoding
(each round drafts, the target keeps the accepted prefix and its own token) with every fixed length and with the
per-class lengths, and prints each one's speed against plain decoding under the fitted costs. The per-class lengths
are chosen on the same answers they are scored on: an upper bound of what `DraftLength` can learn online.

    python recipes/studies/match_classes.py                 # ~10 min the first time (dev answers), then ~1 min
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.offline import embedded_pool_path, load_default_target  # noqa: E402
from hf_metasd.draft_length import match_class  # noqa: E402
from hf_metasd.drafters import CorpusDrafter  # noqa: E402
from recipes.pools import acceptance_matrix  # noqa: E402


@torch.no_grad()
def proposals(drafter, target, prompt: list[int], answer: list[int], length: int) -> list[tuple[int, int, int]]:
    """For every position t of `answer`: (drafted, accepted, match length) of `drafter` proposing after t."""
    d = drafter.spawn(target)
    rows = []
    for t in range(len(answer)):
        budget = min(length, len(answer) - t - 1)
        ids = torch.tensor([prompt + answer[:t]])
        proposal = d.draft(ids, budget)[0][0].tolist() if budget > 0 else []
        accepted = 0
        while accepted < len(proposal) and proposal[accepted] == answer[t + accepted]:
            accepted += 1
        rows.append((len(proposal), accepted, int(d.last_match_length)))
    return rows


def replay(rows: list[tuple[int, int, int]], length_of, verify) -> tuple[float, int]:
    """(seconds, tokens) of speculative decoding whose round at a match of class c drafts ``length_of(c)``."""
    t, seconds, tokens = 0, 0.0, 0
    while t < len(rows):
        drafted, accepted, match = rows[t]
        n = min(length_of(match_class(match)) if drafted else 0, drafted)
        seconds += verify(n + 1)
        t += min(accepted, n) + 1
        tokens += min(accepted, n) + 1
    return seconds, tokens


def _constant(n: int):
    return lambda c: n


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--record-tokens", type=int, default=16, help="proposal length recorded per position")
    p.add_argument("--cap", type=int, default=3, help="longest per-class length (the pool's num_assistant_tokens)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "match-classes")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    matrix_args = acceptance_matrix.parse_args([])
    matrix_args.out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_default_target()
    answers = acceptance_matrix.dev_answers(target, tokenizer, matrix_args)
    drafter = CorpusDrafter.from_folder(embedded_pool_path() / "corpus" / "corpus_all", context_lookup=True)
    table = {
        task: [proposals(drafter, target, q, y, args.record_tokens) for q, y in pairs]
        for task, pairs in answers.items()
    }
    measured = acceptance_matrix.verify_costs(target, answers[matrix_args.tasks[0]][0][0], args.record_tokens)
    ks = np.array(sorted(k for k in measured if k >= 2))
    slope, intercept = np.polyfit(ks, [measured[k] for k in ks], 1)

    def verify(k: int) -> float:  # a plain step is read as a 2-token pass: the line's k = 1 is below any pass here
        return float(intercept + slope * max(k, 2))

    by_class: dict[int, list[tuple[int, int]]] = {}
    for rows in table.values():
        for per in rows:
            for drafted, accepted, match in per:
                if drafted:
                    by_class.setdefault(match_class(match), []).append((drafted, accepted))
    classes = {}
    for c, xs in sorted(by_class.items()):
        value = {
            n: (1 + np.mean([min(a, n, d) for d, a in xs])) / verify(n + 1) for n in range(1, args.record_tokens + 1)
        }
        capped = max((n for n in value if n <= args.cap), key=lambda n: (value[n], n))
        classes[c] = {
            "rounds": len(xs),
            "mean_accepted": float(np.mean([a for _, a in xs])),
            "best_length": max(value, key=lambda n: (value[n], n)),
            "best_length_capped": capped,
        }
    rules = {f"fixed {n}": _constant(n) for n in (1, 2, 3, 4, 8, 16)}
    rules["per class"] = lambda c: classes.get(c, {"best_length_capped": args.cap})["best_length_capped"]
    rules["per class, uncapped"] = lambda c: classes.get(c, {"best_length": args.cap})["best_length"]
    speed = {}
    for name, rule in rules.items():
        speed[name] = {}
        for task, rows in table.items():
            runs = [replay(per, rule, verify) for per in rows]
            speed[name][task] = sum(t for _, t in runs) * verify(1) / sum(s for s, _ in runs)
        total = [replay(per, rule, verify) for rows in table.values() for per in rows]
        speed[name]["overall"] = sum(t for _, t in total) * verify(1) / sum(s for s, _ in total)
    result = {
        "verify_ms": {k: 1000 * v for k, v in measured.items()},
        "verify_fit_ms": [1000 * intercept, 1000 * slope],
        "classes": classes,
        "speed_vs_plain": speed,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "match_classes.json").write_text(json.dumps(result, indent=2))
    print(f"verification (fit): {1000 * intercept:.1f} + {1000 * slope:.2f} k ms")
    print(
        f"| match tokens | rounds | mean accepted of a {args.record_tokens}-token proposal | best length | "
        f"best length <= {args.cap} |"
    )
    print("|---|---|---|---|---|")
    for c, row in classes.items():
        low, high = (1, 1) if c == 0 else (2 ** (c - 1) + 1, 2**c)
        label = str(low) if low == high else f"{low}-{high}"
        print(
            f"| {label} | {row['rounds']} | {row['mean_accepted']:.2f} | {row['best_length']} | "
            f"{row['best_length_capped']} |"
        )
    tasks = list(table)
    print("\n| lengths | " + " | ".join(tasks) + " | overall |")
    print("|---" * (len(tasks) + 2) + "|")
    for name, row in speed.items():
        print(f"| {name} | " + " | ".join(f"{row[t]:.2f}" for t in [*tasks, "overall"]) + " |")
    return result


if __name__ == "__main__":
    main()
