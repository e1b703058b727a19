"""The dev-split acceptance matrix: every candidate drafter x task, and what each drafter costs on this machine.

For greedy decoding, speculative decoding with one fixed drafter is replayed *exactly* without running the target's
verification: the target's greedy answer ``y`` to a prompt is computed once (plain `generate`); a round at position
``t`` lets the drafter propose ``N`` tokens after ``prompt + y[:t]``, the target accepts the longest common prefix
``a`` of the proposal and ``y[t:]``, and the next round starts at ``t + a + 1``. The recipe records, for every
drafter, every dev prompt and **every** position ``t``, what the drafter proposes there and how much of it would be
accepted: the table `recipes/pools/build_default_pool.py` simulates policies on, and the matrix (mean accepted tokens per
round of the fixed drafter) drawn as a heatmap.

Dev prompts: the first ``--val-prompts`` prompts of each task after the shuffle of `recipes/pools/train_drafters.py`
(never used to build corpora or train drafters; benchmark prompts are never read). Corpora: the target's answers to
the *other* training prompts (`recipes/pools/generate_task_outputs.py`).

    python recipes/pools/acceptance_matrix.py                    # writes artifacts/acceptance/{table.pt,matrix.json,...}
    python recipes/pools/acceptance_matrix.py --corpus-sizes 2000 10000 50000 0   # + the corpus size curve (0 = all)
    python recipes/pools/acceptance_matrix.py --context-lookup --models general corpus_code ... # the candidate pool's corpora,
                                                                          # searching the context too
    python recipes/pools/acceptance_matrix.py --context-lookup --merged --models general   # + one corpus over every task
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.benchmark.offline import load_default_target, load_embedded_pool  # noqa: E402
from hf_metasd.drafters import CorpusDrafter, PromptLookupDrafter  # noqa: E402
from recipes.pools.generate_task_outputs import task_split  # noqa: E402
from recipes.pools.train_drafters import TASKS  # noqa: E402

ASSETS = REPO_ROOT / "docs" / "assets" / "bench"


def candidate_pool(folder: str) -> str:
    """The pool whose model drafters are candidates: a copy of the embedded pool, made once, so that rebuilding the
    embedded pool does not remove candidates from later runs."""
    import shutil

    from hf_metasd.benchmark.offline import embedded_pool_path

    path = Path(folder)
    if not path.is_dir():
        shutil.copytree(embedded_pool_path(), path)
    return str(path)


def dev_answers(target, tokenizer, args) -> dict[str, list[tuple[list[int], list[int]]]]:
    """The target's greedy answers (fp32, `max_new_tokens`) to each task's dev prompts, cached."""
    path = args.out / f"dev_answers_new{args.max_new_tokens}_val{args.val_prompts}.pt"
    store = torch.load(path) if path.is_file() else {}
    for task in args.tasks:
        if task in store:
            continue
        dev, _ = task_split(args.data_dir, task, tokenizer, args.seed, args.val_prompts, args.max_prompt_tokens)
        pairs = []
        for _, ids in dev:
            out = target.generate(
                torch.tensor([ids]), do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=2
            )
            pairs.append((ids, out[0, len(ids) :].tolist()))
        store[task] = pairs
        torch.save(store, path)
        print(f"dev answers: {task} ({len(pairs)} prompts)", flush=True)
    return {t: store[t] for t in args.tasks}


def corpus_drafters(args, tasks, max_tokens: int = 0) -> list[CorpusDrafter]:
    """One corpus drafter per task from the target's answers to its training prompts (first `max_tokens`; 0: all)."""
    drafters = []
    for task in tasks:
        path = args.outputs / f"{task}.pt"
        if not path.is_file():
            continue
        outputs = torch.load(path)["outputs"]
        if max_tokens:
            kept, total = [], 0
            for seq in outputs:
                if total >= max_tokens:
                    break
                kept.append(seq[: max_tokens - total])
                total += len(kept[-1])
            outputs = kept
        drafters.append(CorpusDrafter.from_sequences(outputs, name=f"corpus_{task}"))
    return drafters


#: Name of the candidate over every task's corpus at once (``--merged``).
MERGED = "corpus_all"


def merged_corpus(args, tasks, max_tokens: int = 0) -> CorpusDrafter:
    """One corpus drafter over the documents of every task's corpus (each cut to `max_tokens` like
    `corpus_drafters`): the longest match then picks the task's documents itself, without a bandit round."""
    documents = [seq for drafter in corpus_drafters(args, tasks, max_tokens) for seq in drafter.index.documents()]
    return CorpusDrafter.from_sequences(documents, name=MERGED)


def with_context_lookup(drafters: list, on: bool) -> list:
    """`drafters` with every corpus drafter's `context_lookup` set to `on` (a new drafter on the same index)."""
    if not on:
        return drafters
    return [
        CorpusDrafter(d.index, name=d.name, **{**d.config(), "context_lookup": True})
        if isinstance(d, CorpusDrafter)
        else d
        for d in drafters
    ]


@torch.no_grad()
def position_table(drafter, target, prompt: list[int], answer: list[int], n: int) -> list[tuple[int, int, float]]:
    """For every position t of `answer`: (drafted, accepted, seconds) of `drafter` proposing after prompt+answer[:t]."""
    if getattr(drafter, "kind", None) == "feature_head":
        return head_position_table(drafter, target, prompt, answer, n)
    d = drafter.spawn(target)
    rows = []
    for t in range(len(answer)):
        ids = torch.tensor([prompt + answer[:t]])
        budget = min(n, len(answer) - t - 1)
        start = time.perf_counter()
        d.catch_up(ids)
        tokens, _ = d.draft(ids, budget) if budget > 0 else (ids[:, :0], None)
        seconds = time.perf_counter() - start
        proposal = tokens[0].tolist()
        accepted = 0
        while accepted < len(proposal) and proposal[accepted] == answer[t + accepted]:
            accepted += 1
        rows.append((len(proposal), accepted, seconds))
    return rows


@torch.no_grad()
def head_position_table(drafter, target, prompt: list[int], answer: list[int], n: int) -> list[tuple[int, int, float]]:
    """`position_table` of a feature-head drafter. One target pass over ``prompt + answer`` records the features of
    every position (`FeatureRecorder`, as a verification pass would); before drafting at ``t`` the drafter observes
    the features it would have by then: positions ``.. P + t - 2`` (the newest token's feature comes with the next
    pass). At ``t = 0`` no pass has run yet, so the head abstains there, as in `generate`'s first round. The head's
    drafts are independent of which positions it drafted at before (`FeatureHead.draft` drops its own entries), so
    one drafter walks the whole answer."""
    from hf_metasd.feature_head import FeatureRecorder

    ids = torch.tensor([prompt + answer])
    with FeatureRecorder(target, drafter.layer_ids) as recorder:
        target(ids)
    features = recorder.features()
    d = drafter.spawn(target)
    rows, observed = [(0, 0, 0.0)], 0
    for t in range(1, len(answer)):
        length = len(prompt) + t
        start = time.perf_counter()
        d.observe(features[:, observed : length - 1], ids[:, observed + 1 : length], observed)
        observed = length - 1
        budget = min(n, len(answer) - t - 1)
        tokens, _ = d.draft(ids[:, :length], budget) if budget > 0 else (ids[:, :0], None)
        seconds = time.perf_counter() - start
        proposal = tokens[0].tolist()
        accepted = 0
        while accepted < len(proposal) and proposal[accepted] == answer[t + accepted]:
            accepted += 1
        rows.append((len(proposal), accepted, seconds))
    return rows


def head_arms(target, folder: Path, name: str) -> list:
    """The arms of one head folder (`save_head`'s layout, or speculators'): the base head, named `name`, and one arm
    per adapter under ``<folder>/adapters/<task>/`` (the kept ``--lora-task`` output of train_feature_head.py), named
    ``<name>_<task>``, in task order; the arms share one resident head."""
    from hf_metasd.drafters import FeatureHeadDrafter
    from hf_metasd.feature_head import load_adapter, load_feature_head

    head = load_feature_head(str(folder), target)
    adapters = sorted(p for p in (folder / "adapters").glob("*") if p.is_dir())
    for adapter in adapters:
        load_adapter(head, adapter, adapter.name)
    arms = [FeatureHeadDrafter(head, name=name)]
    return arms + [FeatureHeadDrafter(head, adapter=a.name, name=f"{name}_{a.name}") for a in adapters]


def feature_head_drafters(target, folders: list[Path]) -> list:
    """The arms of each head folder (`head_arms`), named ``head_<folder name>`` and ``head_<folder name>_<task>``."""
    return [arm for folder in folders for arm in head_arms(target, folder, f"head_{folder.name}")]


def fixed_rounds(rows: list[tuple[int, int, float]], n: int) -> tuple[int, int]:
    """(rounds, accepted drafted tokens) of speculative decoding with this drafter alone drafting up to `n` tokens
    (the recorded proposals are truncated: greedy drafts of n tokens are prefixes of longer ones)."""
    t, rounds, accepted = 0, 0, 0
    while t < len(rows):
        a = min(rows[t][1], n)
        rounds += 1
        accepted += a
        t += a + 1
    return rounds, accepted


@torch.no_grad()
def verify_costs(target, prompt: list[int], n: int, repeats: int = 15, rows: int = 4) -> dict[int, float]:
    """Median seconds of a target forward over k = 1..n+1 tokens after `prompt` (with a cache), this machine, under
    the verification kernel `hf_metasd.generate` chooses on this machine for `rows`-token passes."""
    from contextlib import nullcontext

    from hf_metasd.kernels import choose_verification_kernel, skinny_linear

    choice = choose_verification_kernel(target, [rows])
    print(f"verification kernel: {choice}", flush=True)
    with skinny_linear(target) if choice.kernel == "skinny" else nullcontext():
        return _verify_costs(target, prompt, n, repeats)


def _verify_costs(target, prompt: list[int], n: int, repeats: int) -> dict[int, float]:
    from transformers import DynamicCache

    costs = {}
    for k in range(1, n + 2):
        samples = []
        for _ in range(repeats):
            cache = DynamicCache(config=target.config)
            target(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True, logits_to_keep=1)
            extra = torch.tensor([prompt[-k:]])
            start = time.perf_counter()
            target(input_ids=extra, cache=cache, use_cache=True, logits_to_keep=k)
            samples.append(time.perf_counter() - start)
        costs[k] = statistics.median(samples)
    return costs


def heatmap(matrix: dict[str, dict[str, float]], tasks, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(matrix)
    values = [[matrix[name].get(task, float("nan")) for task in tasks] for name in names]
    fig, ax = plt.subplots(figsize=(1.1 * len(tasks) + 3, 0.45 * len(names) + 1.5))
    image = ax.imshow(values, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right")
    ax.set_yticks(range(len(names)), names)
    for i, row in enumerate(values):
        for j, v in enumerate(row):
            ax.text(
                j,
                i,
                f"{v:.2f}",
                ha="center",
                va="center",
                color="white" if v < 0.6 * max(map(max, values)) else "black",
                fontsize=8,
            )
    fig.colorbar(image, ax=ax, label="accepted tokens per round")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def size_curve_plot(curve: dict[str, dict[str, float]], corpus_tokens: dict[str, int], path: Path) -> None:
    """Accepted tokens per round of each task's corpus on its own dev prompts against the corpus's tokens (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for task, points in curve.items():
        full = corpus_tokens.get(f"corpus_{task}", 0)
        xy = sorted((min(int(k), full) if k != "all" else full, v) for k, v in points.items())
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=task)
    ax.set_xscale("log")
    ax.set_xlabel("corpus tokens (the target's answers to training prompts)")
    ax.set_ylabel("accepted tokens per round, own task")
    ax.set_title("Corpus size against acceptance, dev split", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument("--outputs", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "acceptance")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--val-prompts", type=int, default=10)
    p.add_argument("--max-prompt-tokens", type=int, default=768)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", type=int, default=3, help="draft length of the matrix")
    p.add_argument("--record-tokens", type=int, default=6, help="proposal length recorded per position")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--models", nargs="*", default=None, help="model drafters of --candidates to include (default: all)"
    )
    p.add_argument(
        "--candidates",
        default=str(REPO_ROOT / "artifacts" / "candidate-pool"),
        help="pool folder whose model drafters are candidates (default: a copy of the embedded pool made on first run)",
    )
    p.add_argument(
        "--context-lookup",
        action="store_true",
        help="corpus candidates also search the context (`CorpusDrafter(context_lookup=True)`)",
    )
    p.add_argument(
        "--merged",
        action="store_true",
        help=f"also a candidate `{MERGED}`: one corpus drafter over every task's corpus",
    )
    p.add_argument(
        "--feature-heads", nargs="*", type=Path, default=[], help="also: feature heads (folders of `save_head`)"
    )
    p.add_argument(
        "--no-corpora", action="store_true", help="leave out the per-task corpora and prompt lookup (heads only)"
    )
    p.add_argument("--corpus-sizes", nargs="*", type=int, default=[], help="also: corpus size curve (0 = all)")
    p.add_argument(
        "--costs-only",
        action="store_true",
        help="re-measure drafting and verification costs (on a quiet machine) into an existing table.pt",
    )
    return p.parse_args(argv)


def remeasure_costs(args, target, candidates, answers) -> None:
    """Drafting (2 dev prompts per task) and verification costs measured again, into table.pt and matrix.json."""
    path = args.out / "table.pt"
    data = torch.load(path)
    record = data["record_tokens"]
    for drafter in candidates:
        seconds = [
            s
            for pairs in answers.values()
            for p, y in pairs[:2]
            for _, _, s in position_table(drafter, target, p, y, record)
        ]
        data["draft_ms"][drafter.name] = 1000 * statistics.median(seconds)
    data["verify_ms"] = {k: 1000 * v for k, v in verify_costs(target, answers[args.tasks[0]][0][0], record).items()}
    torch.save(data, path)
    result = json.loads((args.out / "matrix.json").read_text())
    result.update(draft_ms=data["draft_ms"], verify_ms=data["verify_ms"])
    (args.out / "matrix.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    print(json.dumps({k: result[k] for k in ("draft_ms", "verify_ms")}, indent=1))


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    target, tokenizer = load_default_target(torch.float32)
    answers = dev_answers(target, tokenizer, args)
    pool = load_embedded_pool(target, candidate_pool(args.candidates))
    models = [d for d in pool.drafters if d.kind != "prompt_lookup" and (args.models is None or d.name in args.models)]
    merged = [merged_corpus(args, args.tasks)] if args.merged else []
    corpora = [] if args.no_corpora else [*corpus_drafters(args, args.tasks), PromptLookupDrafter()]
    heads = feature_head_drafters(target, args.feature_heads)
    candidates = with_context_lookup([*corpora, *merged, *models, *heads], args.context_lookup)
    if args.costs_only:
        remeasure_costs(args, target, candidates, answers)
        return {}
    n, record = args.num_assistant_tokens, args.record_tokens
    table: dict[str, dict[str, list]] = {}
    for drafter in candidates:
        table[drafter.name] = {}
        start = time.perf_counter()
        for task, pairs in answers.items():
            table[drafter.name][task] = [position_table(drafter, target, p, y, record) for p, y in pairs]
        print(f"{drafter.name}: {time.perf_counter() - start:.1f}s", flush=True)
    matrix = {}
    for name, by_task in table.items():
        matrix[name] = {}
        for task, prompts in by_task.items():
            rounds = [fixed_rounds(rows, n) for rows in prompts]
            matrix[name][task] = sum(a for _, a in rounds) / sum(r for r, _ in rounds)
    draft_ms = {
        name: 1000 * statistics.median(s for prompts in by_task.values() for rows in prompts for _, _, s in rows)
        for name, by_task in table.items()
    }
    prompt = answers[args.tasks[0]][0][0]
    verify = {k: 1000 * v for k, v in verify_costs(target, prompt, record).items()}
    result = {
        "matrix": matrix,
        "draft_ms": draft_ms,
        "verify_ms": verify,
        "num_assistant_tokens": n,
        "record_tokens": record,
        "max_new_tokens": args.max_new_tokens,
        "dev_prompts_per_task": args.val_prompts,
        "corpus_tokens": {d.name: int(d.index.num_tokens) for d in candidates if isinstance(d, CorpusDrafter)},
    }
    if args.corpus_sizes:
        curve: dict[str, dict[str, float]] = {}
        for size in args.corpus_sizes:
            for drafter in with_context_lookup(corpus_drafters(args, args.tasks, size), args.context_lookup):
                task = drafter.name.removeprefix("corpus_")
                rounds = [fixed_rounds(position_table(drafter, target, p, y, n), n) for p, y in answers[task]]
                curve.setdefault(task, {})[str(size or "all")] = sum(a for _, a in rounds) / sum(r for r, _ in rounds)
            print(f"corpus size {size or 'all'} done", flush=True)
        result["corpus_size_curve"] = curve
        size_curve_plot(curve, result["corpus_tokens"], args.out / "corpus_size_curve.png")
    # drafters that run a model over the tokens others drafted (a catch-up step); a feature head reads the target's
    # features instead and has nothing to catch up on
    models = {d.name: d.kind not in ("prompt_lookup", "corpus", "feature_head") for d in candidates}
    torch.save(
        {
            "table": table,
            "answers": answers,
            "verify_ms": verify,
            "draft_ms": draft_ms,
            "model": models,
            "record_tokens": record,
        },
        args.out / "table.pt",
    )
    (args.out / "matrix.json").write_text(json.dumps(result, indent=2, sort_keys=True))
    heatmap(matrix, args.tasks, args.out / "acceptance_matrix.png", "Mean accepted tokens per round, dev split")
    print(json.dumps({k: result[k] for k in ("draft_ms", "verify_ms")}, indent=1))
    for name, row in matrix.items():
        print(f"{name:<28}" + " ".join(f"{row[t]:5.2f}" for t in args.tasks))
    return result


if __name__ == "__main__":
    main()
