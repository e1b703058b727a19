"""Benchmark prompts shipped with the package: Spec-Bench (6 tasks) and HumanEval (our `code` task).

See `hf_metasd/benchmark/data/README.md` for sources and licences. Benchmark only: never train drafters on these.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ..errors import BenchmarkConfigError, BenchmarkFileNotFoundError

__all__ = ["BENCH_TASKS", "BenchPrompt", "load_bench_prompts", "load_prompts_file", "mixed_stream"]

#: The most prompts and characters per prompt `load_prompts_file` reads (a guard against a wrong file, not a limit of
#: the benchmark: split a larger set into several runs).
MAX_FILE_PROMPTS = 10_000
MAX_PROMPT_CHARS = 200_000

#: Spec-Bench's MT-Bench sub-categories, counted as one task.
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
#: Tasks in benchmark order; each matches a drafter-training task of `recipes/pools/train_drafters.py`.
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
        raise BenchmarkConfigError(
            f"`tasks` must be among {list(BENCH_TASKS)}, but has {unknown}. Drop or fix those names."
        )
    by_task: dict[str, list[BenchPrompt]] = {t: [] for t in BENCH_TASKS}
    for prompt in _read_spec_bench() + _read_humaneval():
        by_task[prompt.task].append(prompt)
    return [p for t in tasks for p in (by_task[t] if per_task is None else by_task[t][:per_task])]


def _decode(raw: bytes, where: str, *, first: bool) -> str:
    """One line of a prompts file as text: UTF-8, a byte order mark allowed at the start of the file (some editors
    write one), else a `BenchmarkConfigError` naming the line and the first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8-sig" if first else "utf-8")
    except UnicodeDecodeError as error:
        raise BenchmarkConfigError(
            f"`prompts` must be a UTF-8 text file, but {where} is not UTF-8 (byte {raw[error.start]:#04x} at byte "
            f"{error.start + 1} of the line). Save the file as UTF-8."
        ) from None


def load_prompts_file(
    path: str | Path, tasks: Sequence[str] | None = None, per_task: int | None = None
) -> list[BenchPrompt]:
    r"""A user's own prompts from a JSON Lines file in UTF-8 (a byte order mark is allowed): one
    ``{"task": str, "prompt": str}`` object per line (an ``"id"`` is optional; by default
    ``<file name>/<line number>``). Blank lines are skipped. Tasks are free names (they group the benchmark's per-task
    table); `tasks` keeps only those, and `per_task` the first that many of each, in file order. A file that breaks
    these rules raises a `BenchmarkConfigError` naming the line (`BenchmarkFileNotFoundError`: no such file).

    Example:
        >>> import json, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "mine.jsonl")
        >>> rows = [{"task": "chat", "prompt": "Hi!"}, {"task": "code", "prompt": "def f():", "id": "f"}]
        >>> _ = open(path, "w").write("\n".join(json.dumps(r) for r in rows))
        >>> [(p.task, p.id, p.text) for p in load_prompts_file(path)]
        [('chat', 'mine.jsonl/1', 'Hi!'), ('code', 'f', 'def f():')]
    """
    path = Path(path)
    if not path.is_file():
        raise BenchmarkFileNotFoundError(
            f"`prompts` must be a JSON Lines file, but {str(path)!r} is not a file. Check the path."
        )
    out: list[BenchPrompt] = []
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path.name} line {number}"
            line = _decode(raw, where, first=number == 1)
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise BenchmarkConfigError(
                    f"every line of `prompts` must be a JSON object, but {where} is not JSON ({error.msg}). "
                    'Write one {"task": ..., "prompt": ...} object per line.'
                ) from None
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("task"), str)
                or not isinstance(row.get("prompt"), str)
            ):
                raise BenchmarkConfigError(
                    f"every line of `prompts` must be an object with string keys `task` and `prompt`, but {where} is "
                    f'{line.strip()[:80]!r}. Write one {{"task": ..., "prompt": ...}} object per line.'
                )
            if not row["prompt"].strip() or len(row["prompt"]) > MAX_PROMPT_CHARS:
                raise BenchmarkConfigError(
                    f"a prompt must have 1 to {MAX_PROMPT_CHARS} characters, but {where} has {len(row['prompt'])}. "
                    "Fix or drop that line."
                )
            out.append(BenchPrompt(row["task"], str(row.get("id", f"{path.name}/{number}")), row["prompt"]))
            if len(out) > MAX_FILE_PROMPTS:
                raise BenchmarkConfigError(
                    f"`prompts` must hold at most {MAX_FILE_PROMPTS} prompts, but {path.name} has more. "
                    "Split it into several runs."
                )
    if not out:
        raise BenchmarkConfigError(f"`prompts` must hold at least one prompt, but {path.name} has none. Add lines.")
    if tasks:
        unknown = sorted(set(tasks) - {p.task for p in out})
        if unknown:
            raise BenchmarkConfigError(
                f"`tasks` must be tasks of {path.name} {sorted({p.task for p in out})}, but has {unknown}. "
                "Drop or fix those names."
            )
        out = [p for p in out if p.task in tasks]
    if per_task is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in out:
            seen[p.task] = seen.get(p.task, 0) + 1
            if seen[p.task] <= per_task:
                kept.append(p)
        out = kept
    return out


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
