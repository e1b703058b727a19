"""The corpus drafter's index: a suffix array (`hf_metasd.drafters.CorpusIndex`) against a naive dict of n-gram
tuples, and the settings that decide when it drafts.

Part 1, index designs (build time, memory, median time of one draft): on the target's answers in
``--task-outputs/<task>.pt`` (written by `generate_task_outputs.py`; every file present is used, all tasks in one
corpus) and on synthetic corpora of ``--synthetic-sizes`` tokens (Zipf-distributed phrases, vocabulary 49,152). The
naive index maps every n-gram (``n <= --max-match-length``, and a shorter ``n <= 4`` variant) to the positions that
follow it; it drafts with the same vote, and the recipe checks that it proposes the same tokens as the suffix array.
Memory is what `tracemalloc` sees retained after the build (numpy arrays included).

Part 2, the greedy acceptance proxy (needs real answers): for a held-out 10 % of one task's answers (``--task``;
default the task with the most answer tokens), at every position ``t`` of every held-out answer, the drafter built on
the other 90 % proposes ``--num-tokens`` tokens after ``prompt + answer[:t]``; a proposal is worth the length of its
common prefix with ``answer[t:]`` (what greedy verification would accept: the answers are the target's own greedy
output). Reported per setting: the share of positions where the drafter drafts, accepted tokens per drafted round
and per position, accepted / proposed, and a net figure ``accepted - c * proposed`` per position with
``c = --verify-cost`` (the extra target cost of verifying one more token, in target steps; ~0.08 for SmolLM2 on CPU,
see /work/shared/MODELS.md). Prompt lookup on the same positions is the baseline.

Run from the repository root (seconds to a few minutes)::

    python recipes/studies/bench_corpus_index.py
    python recipes/studies/bench_corpus_index.py --task mt_bench --synthetic-sizes 100000 --draft-calls 500

Timings are wall-clock on whatever else the machine runs: compare rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from hf_metasd.drafters import CorpusDrafter, CorpusIndex, prompt_lookup_candidates

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------------------------------
# the naive index, for comparison (same match and vote semantics as CorpusDrafter)
# ---------------------------------------------------------------------------------------------------------------------
class NgramDictIndex:
    """``{n: {ngram tuple: [positions after it]}}`` for ``n <= max_n``; documents never share an n-gram window."""

    def __init__(self, documents: list[list[int]], max_n: int) -> None:
        self.max_n = max_n
        self.tables: list[dict[tuple[int, ...], list[int]]] = [{} for _ in range(max_n + 1)]
        self.flat: list[int] = []
        self.ends: list[int] = []  # document end (exclusive) for each flat position
        for doc in documents:
            base = len(self.flat)
            self.flat.extend(doc)
            self.ends.extend([base + len(doc)] * len(doc))
            for n in range(1, max_n + 1):
                table = self.tables[n]
                for i in range(len(doc) - n + 1):
                    table.setdefault(tuple(doc[i : i + n]), []).append(base + i + n)

    def propose(self, context: list[int], num_tokens: int, settings: dict) -> list[int]:
        for n in range(min(self.max_n, settings["max_match_length"], len(context)), 0, -1):
            hits = self.tables[n].get(tuple(context[-n:]))
            if hits is None:
                continue
            if n < settings["min_match_length"]:
                return []
            k = settings["max_occurrences"]
            if len(hits) > k:
                hits = [hits[(i * len(hits)) // k] for i in range(k)]
            rows = []
            for start in hits:
                end = min(start + num_tokens, self.ends[start - 1])
                row = self.flat[start:end]
                rows.append(row + [-1] * (num_tokens - len(row)))
            return vote(rows, num_tokens, settings["min_frequency"])
        return []


def vote(rows: list[list[int]], num_tokens: int, min_frequency: float) -> list[int]:
    """The corpus drafter's vote, written again plainly (most votes, ties to the lowest id, end loses ties)."""
    draft: list[int] = []
    for j in range(num_tokens):
        counts = Counter(row[j] for row in rows)
        token, votes = min(counts.items(), key=lambda kv: (-kv[1], kv[0] < 0, kv[0]))
        if token < 0 or votes < min_frequency * len(rows):
            break
        draft.append(token)
        rows = [row for row in rows if row[j] == token]
    return draft


# ---------------------------------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------------------------------
def load_task_outputs(folder: Path) -> dict[str, dict]:
    """``{task: {"prompts": [[ids]], "outputs": [[ids]]}}`` for every readable ``<task>.pt`` (files may be growing)."""
    stores = {}
    for path in sorted(folder.glob("*.pt")):
        try:
            store = torch.load(path)
        except Exception as err:  # a file being rewritten by generate_task_outputs.py: skip it this time
            print(f"skipping {path.name}: {type(err).__name__}: {err}")
            continue
        if store.get("outputs"):
            stores[path.stem] = store
    return stores


def synthetic_documents(num_tokens: int, seed: int = 0, vocab: int = 49152) -> list[list[int]]:
    """Documents of ~200 tokens made of Zipf-distributed recurring phrases (60 %) and random 5-token runs."""
    rng = np.random.default_rng(seed)
    phrases = [rng.integers(0, vocab, int(rng.integers(3, 30))) for _ in range(5000)]
    docs, total = [], 0
    while total < num_tokens:
        parts = [
            phrases[int(rng.zipf(1.3)) % len(phrases)] if rng.random() < 0.6 else rng.integers(0, vocab, 5)
            for _ in range(16)
        ]
        doc = np.concatenate(parts)[: num_tokens - total].tolist()
        docs.append(doc)
        total += len(doc)
    return docs


def contexts_from(documents: list[list[int]], count: int, seed: int = 1) -> list[list[int]]:
    """`count` contexts: a document prefix, cut at a random position (the last 64 tokens kept)."""
    rng = np.random.default_rng(seed)
    docs = [d for d in documents if len(d) > 2]
    out = []
    for _ in range(count):
        doc = docs[int(rng.integers(len(docs)))]
        end = int(rng.integers(2, len(doc)))
        out.append(doc[max(0, end - 64) : end])
    return out


# ---------------------------------------------------------------------------------------------------------------------
# part 1: index designs
# ---------------------------------------------------------------------------------------------------------------------
def measure_build(build):
    """(object, seconds, retained bytes): timed once untraced, then rebuilt under tracemalloc for its memory."""
    gc.collect()
    start = time.perf_counter()
    obj = build()
    seconds = time.perf_counter() - start
    del obj
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    obj = build()
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return obj, seconds, retained


def median_ms(fn, contexts, repeats: int = 1) -> float:
    times = []
    for _ in range(repeats):
        for c in contexts:
            start = time.perf_counter()
            fn(c)
            times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def compare_indexes(label: str, documents: list[list[int]], contexts: list[list[int]], args) -> list[str]:
    settings = {  # the drafter's defaults (but `--max-match-length`)
        "max_match_length": args.max_match_length,
        "min_match_length": 2,
        "max_occurrences": 64,
        "min_frequency": 0.25,
    }
    tokens = sum(len(d) for d in documents)
    rows = []
    drafter, seconds, retained = measure_build(lambda: CorpusDrafter.from_sequences(documents, **settings))
    ctx_tensors = [torch.tensor([c]) for c in contexts]
    core = median_ms(lambda c: drafter.propose(c, args.num_tokens), contexts)
    full = median_ms(lambda t: drafter.draft(t, args.num_tokens), ctx_tensors)
    rows.append(
        f"| {label} | {tokens:,} | suffix array | {seconds:.2f} | {retained / 1e6:.1f} ({retained / tokens:.0f} B/token) "
        f"| {core:.3f} | {full:.3f} |"
    )
    for max_n in (args.max_match_length, 4):
        if tokens * max_n > args.naive_max_entries:
            rows.append(
                f"| {label} | {tokens:,} | n-gram dict, n <= {max_n} | skipped (> --naive-max-entries) | | | |"
            )
            continue
        naive, seconds, retained = measure_build(lambda n=max_n: NgramDictIndex(documents, n))
        core = median_ms(lambda c, ix=naive: ix.propose(c, args.num_tokens, settings), contexts)
        same = ""
        if max_n >= args.max_match_length:
            # every occurrence votes in both (no sampling), so the drafts must be equal
            every = {**settings, "max_occurrences": 10**9}
            exact = CorpusDrafter(drafter.index, **every)
            agree = sum(
                naive.propose(c, args.num_tokens, every) == exact.propose(c, args.num_tokens) for c in contexts
            )
            same = f" (same drafts as the suffix array: {agree}/{len(contexts)})"
        rows.append(
            f"| {label} | {tokens:,} | n-gram dict, n <= {max_n}{same} | {seconds:.2f} | {retained / 1e6:.1f} "
            f"({retained / tokens:.0f} B/token) | {core:.3f} | |"
        )
        del naive
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# part 2: acceptance proxy
# ---------------------------------------------------------------------------------------------------------------------
def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def acceptance(store: dict, args) -> list[str]:
    """The greedy acceptance proxy, over `--folds` disjoint held-out 10 % folds (more folds: the same figure, less
    noise), each scored with a corpus built on the other answers."""
    pairs = list(zip(store["prompts"], store["outputs"]))
    order = np.random.default_rng(args.seed).permutation(len(pairs)).tolist()
    fold_size = max(1, len(pairs) // 10)
    folds = []
    for k in range(min(args.folds, len(pairs) // fold_size)):
        held = set(order[k * fold_size : (k + 1) * fold_size])
        train = [pairs[i] for i in range(len(pairs)) if i not in held]
        positions = [(pairs[i][0], pairs[i][1], t) for i in sorted(held) for t in range(len(pairs[i][1]))]
        answers = CorpusIndex.from_sequences([o for _, o in train])
        with_prompts = CorpusIndex.from_sequences([o for _, o in train] + [p for p, _ in train])
        folds.append((answers, with_prompts, positions))
    n_tok = args.num_tokens
    total = sum(len(f[2]) for f in folds)
    lines = [
        f"{len(folds)} held-out folds of {fold_size} answers ({total:,} positions); each corpus: the other "
        f"{len(pairs) - fold_size} answers (~{folds[0][0].num_tokens:,} tokens); {n_tok} tokens per round; "
        f"c = {args.verify_cost}",
        "",
        "| drafter | setting | drafts at | accepted / drafted round | accepted / position | accepted / proposed "
        "| net / position |",
        "|---|---|---|---|---|---|---|",
    ]
    lookup: dict[tuple[int, int, int], list[int]] = {}  # prompt lookup does not depend on the fold's corpus

    def prompt_lookup(ngram: int, key: tuple[int, int, int], ctx: list[int]) -> list[int]:
        if (ngram, *key) not in lookup:
            lookup[(ngram, *key)] = prompt_lookup_candidates(torch.tensor(ctx), n_tok, ngram).tolist()
        return lookup[(ngram, *key)]

    def row(name: str, setting: str, make) -> str:
        """`make(answers_index, with_prompts_index)` -> ``propose(key, context)`` for one fold."""
        drafted = accepted = proposed = 0
        for answers, with_prompts, positions in folds:
            propose = make(answers, with_prompts)
            for prompt, output, t in positions:
                proposal = propose((id(output), t), prompt + output[:t])
                if proposal:
                    drafted += 1
                    proposed += len(proposal)
                    accepted += common_prefix(proposal, output[t : t + n_tok])
        return (
            f"| {name} | {setting} | {drafted / total:.1%} | {accepted / max(drafted, 1):.2f} | {accepted / total:.3f} "
            f"| {accepted / max(proposed, 1):.1%} | {(accepted - args.verify_cost * proposed) / total:.3f} |"
        )

    def corpus(source: str = "answers", **settings):
        def make(answers, with_prompts):
            drafter = CorpusDrafter(answers if source == "answers" else with_prompts, **settings)
            return lambda key, ctx: drafter.propose(ctx, n_tok)

        return make

    for min_match in (1, 2, 3, 4, 6, 8):
        for min_frequency in (0.0, 0.25, 0.5):
            lines.append(
                row("corpus (answers)", f"min_match_length={min_match}, min_frequency={min_frequency}",
                    corpus(min_match_length=min_match, min_frequency=min_frequency))
            )  # fmt: skip
    lines.append(row("corpus (answers + prompts)", "defaults", corpus("answers + prompts")))
    for ngram in (2, 3):
        lines.append(
            row("prompt lookup", f"max_matching_ngram_size={ngram}",
                lambda a, w, g=ngram: lambda key, ctx: prompt_lookup(g, key, ctx))
        )  # fmt: skip
    # a pool of the two where prompt lookup is preferred: its abstention hands the round to the corpus drafter
    for min_match in (1, 2, 3):
        for min_frequency in (0.0, 0.25):

            def chained(answers, with_prompts, m=min_match, f=min_frequency):
                drafter = CorpusDrafter(answers, min_match_length=m, min_frequency=f)
                return lambda key, ctx: prompt_lookup(3, key, ctx) or drafter.propose(ctx, n_tok)

            lines.append(
                row("prompt lookup (n=3), else corpus", f"min_match_length={min_match}, min_frequency={min_frequency}",
                    chained)
            )  # fmt: skip
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task-outputs", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs")
    parser.add_argument(
        "--task", default=None, help="task of the acceptance proxy (default: most answer tokens; 'all': every task)"
    )
    parser.add_argument("--folds", type=int, default=10, help="held-out 10 %% folds scored (1 to 10)")
    parser.add_argument("--synthetic-sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--naive-max-entries", type=int, default=4_000_000, help="skip naive indexes above this")
    parser.add_argument("--draft-calls", type=int, default=2000)
    parser.add_argument("--num-tokens", type=int, default=5, help="tokens per round (the default draft length)")
    parser.add_argument("--max-match-length", type=int, default=16)
    parser.add_argument("--verify-cost", type=float, default=0.08)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    stores = load_task_outputs(args.task_outputs)
    print("task outputs:", {t: sum(len(o) for o in s["outputs"]) for t, s in stores.items()} or "none")
    table = [
        "| corpus | tokens | index | build (s) | memory (MB) | median propose (ms) | median draft (ms) |",
        "|---|---|---|---|---|---|---|",
    ]
    if stores:
        documents = [o for s in stores.values() for o in s["outputs"]]
        contexts = contexts_from(documents, args.draft_calls, args.seed + 1)
        table += compare_indexes("task answers", documents, contexts, args)
    for size in args.synthetic_sizes:
        documents = synthetic_documents(size, args.seed)
        table += compare_indexes("synthetic", documents, contexts_from(documents, args.draft_calls), args)
    print("\n".join(table))
    if stores:
        task = args.task or max(stores, key=lambda t: sum(len(o) for o in stores[t]["outputs"]))
        if task == "all":
            store = {key: [x for s in stores.values() for x in s[key]] for key in ("prompts", "outputs")}
        else:
            store = stores[task]
        print(f"\nacceptance proxy on {task!r}")
        print("\n".join(acceptance(store, args)))
    print("\n(timings on a shared machine: compare rows, not runs)")


if __name__ == "__main__":
    main()
