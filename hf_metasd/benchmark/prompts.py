"""Benchmark prompts shipped with the package: Spec-Bench (6 tasks) and HumanEval (our `code` task).

See `hf_metasd/benchmark/data/README.md` for sources and licences. Benchmark only: never train drafters on these.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from importlib import resources

__all__ = ["BENCH_TASKS", "BenchPrompt", "load_bench_prompts", "mixed_stream"]

#: Spec-Bench's MT-Bench sub-categories, counted as one task.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: Tasks in benchmark order; each matches a drafter-training task of `recipes/train_drafters.py`.
BENCH_TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code")


@dataclass(frozen=True)
class BenchPrompt:
    """One benchmark prompt: `task` (one of `BENCH_TASKS`), an id and the first-turn text."""

    task: str
    id: str
    text: str


def _read_spec_bench() -> list[BenchPrompt]:
    path = resources.files("hf_metasd.benchmark") / "data" / "spec_bench_question.jsonl"
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        task = "mt_bench" if row["category"] in MT_BENCH_CATEGORIES else row["category"]
        out.append(BenchPrompt(task, f"spec_bench/{row['question_id']}", row["turns"][0]))
    return out


def _read_humaneval() -> list[BenchPrompt]:
    path = resources.files("hf_metasd.benchmark") / "data" / "humaneval_HumanEval.jsonl.gz"
    with gzip.open(str(path), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [
        BenchPrompt("code", row["task_id"], f"Complete the following Python function.\n\n{row['prompt']}")
        for row in rows
    ]


def load_bench_prompts(
    tasks: tuple[str, ...] | list[str] = BENCH_TASKS, per_task: int | None = None
) -> list[BenchPrompt]:
    """Prompts of `tasks`, at most `per_task` each, in file order (deterministic).

    Example:
        >>> prompts = load_bench_prompts(per_task=2)
        >>> [p.task for p in prompts][:4], len(prompts)
        (['mt_bench', 'mt_bench', 'translation', 'translation'], 14)
    """
    unknown = sorted(set(tasks) - set(BENCH_TASKS))
    if unknown:
        raise ValueError(f"`tasks` must be among {list(BENCH_TASKS)}, but has {unknown}. Drop or fix those names.")
    by_task: dict[str, list[BenchPrompt]] = {t: [] for t in BENCH_TASKS}
    for prompt in _read_spec_bench() + _read_humaneval():
        by_task[prompt.task].append(prompt)
    return [p for t in tasks for p in (by_task[t] if per_task is None else by_task[t][:per_task])]


def mixed_stream(prompts: list[BenchPrompt]) -> list[BenchPrompt]:
    """Interleave tasks round-robin (task A, B, C, ..., A, B, ...): the `--mixed` stream.

    Example:
        >>> [p.task for p in mixed_stream(load_bench_prompts(("qa", "rag"), per_task=2))]
        ['qa', 'rag', 'qa', 'rag']
    """
    queues: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        queues.setdefault(p.task, []).append(p)
    out: list[BenchPrompt] = []
    while any(queues.values()):
        for queue in queues.values():
            if queue:
                out.append(queue.pop(0))
    return out
