"""Benchmark results: per-method, per-task metrics, the hindsight oracle, `results.json`, a markdown table, plots.

Metrics, per task and overall (Spec-Bench's names):

* ``mean_accepted_tokens`` (τ): tokens produced per target forward pass (accepted drafts + the target's own token),
  counted with a forward hook on the target, so it is defined for every method (autoregressive: 1).
* ``tokens_per_second``: new tokens / wall seconds.
* ``speedup``: autoregressive wall seconds / the method's wall seconds, summed over the task's prompts.
* ``best_arm_ratio``: share of MetaSD rounds drafted by the task's own drafter (drafters named after tasks).
* ``identical``: share of outputs identical to autoregressive (must be 1.0 in float32).
* ``near_ties`` / ``largest_near_tie_gap``: outputs that left autoregressive output only at a near-tie (bfloat16,
  float16: `hf_metasd.lossless`), and the largest float32 logit gap among them; ``errors``: outputs that left it
  otherwise (must be 0).

The per-task **oracle** is the best single drafter in hindsight: on each task, the `fixed[<name>]` method with the
highest speedup on that task (not the drafter named after it).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ..stats import TIME_PARTS
from .records import BenchRecord

__all__ = ["machine", "summarize", "write_report"]


def _aggregate(records: list[BenchRecord], baseline: dict[str, float], names: list[str]) -> dict[str, Any]:
    seconds = sum(r.seconds for r in records)
    tokens = sum(r.new_tokens for r in records)
    forwards = sum(r.target_forwards for r in records)
    base = sum(baseline[r.prompt_id] for r in records)
    out: dict[str, Any] = {
        "prompts": len(records),
        "seconds": seconds,
        "new_tokens": tokens,
        "tokens_per_second": tokens / seconds if seconds else 0.0,
        "mean_accepted_tokens": tokens / forwards if forwards else 0.0,
        "speedup": base / seconds if seconds else 0.0,
        "identical": sum(r.identical for r in records) / len(records),
        "near_ties": sum(r.near_tie for r in records),
        "largest_near_tie_gap": max((abs(r.divergence["gap"]) for r in records if r.near_tie), default=0.0),
        "errors": sum(not r.lossless for r in records),
    }
    if any(r.time_split for r in records):
        split = {k: sum(r.time_split.get(k, 0.0) for r in records) for k in TIME_PARTS}
        split["other"] = seconds - sum(split.values())  # transformers' loop outside the timed parts, generate setup
        out["ms_per_token"] = {k: 1000 * v / tokens for k, v in split.items()} if tokens else {}
    rounds = [(r.task, a) for r in records for a in r.arms]
    if rounds and any(task in names for task, _ in rounds):
        hits = sum(1 for task, a in rounds if task in names and a < len(names) and names[a] == task)
        out["best_arm_ratio"] = hits / len(rounds)
    return out


def summarize(records: list[BenchRecord], drafter_names: Sequence[str]) -> dict[str, Any]:
    """Per-method, per-task and overall metrics; the oracle is derived from the `fixed[<task>]` runs."""
    names = list(drafter_names)
    baseline = {r.prompt_id: r.seconds for r in records if r.method == "autoregressive"}
    by_method: dict[str, list[BenchRecord]] = {}
    for r in records:
        by_method.setdefault(r.method, []).append(r)
    fixed = sorted({r.method for r in records if r.method.startswith("fixed[")})
    if fixed and "oracle" not in by_method:  # per task, the single drafter that was fastest on it in hindsight
        oracle = []
        for task in dict.fromkeys(r.task for r in records):

            def seconds(method: str, task: str = task) -> float:
                return sum(r.seconds for r in by_method[method] if r.task == task)

            best = min(fixed, key=seconds)
            oracle += [r for r in by_method[best] if r.task == task]
        by_method["oracle"] = oracle
    tasks = list(dict.fromkeys(r.task for r in records))
    summary: dict[str, Any] = {}
    for method, rows in by_method.items():
        entry = {"overall": _aggregate(rows, baseline, names)}
        for task in tasks:
            task_rows = [r for r in rows if r.task == task]
            if task_rows:
                entry[task] = _aggregate(task_rows, baseline, names)
        summary[method] = entry
    return summary


def machine() -> dict[str, Any]:
    import transformers

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "commit": commit,
    }


def _markdown(summary: dict[str, Any], tasks: list[str]) -> str:
    header = (
        "| method | "
        + " | ".join(tasks)
        + " | overall speedup | τ | tokens/s | best-arm | identical | near-ties | errors |"
    )
    lines = [
        "Speedup vs autoregressive per task (wall-time ratio, same prompts, same run); τ = tokens per target forward; "
        "identical = share of outputs identical to autoregressive, near-ties = outputs that left it at a near-tie "
        "(low precision; hf_metasd.lossless), errors = outputs that left it otherwise.",
        "",
        header,
        "|" + "---|" * (len(tasks) + 8),
    ]
    for method, entry in summary.items():
        cells = [f"{entry[t]['speedup']:.2f}" if t in entry else "–" for t in tasks]
        overall = entry["overall"]
        best = overall.get("best_arm_ratio")
        lines.append(
            f"| {method} | "
            + " | ".join(cells)
            + f" | {overall['speedup']:.2f} | {overall['mean_accepted_tokens']:.2f} | {overall['tokens_per_second']:.1f}"
            + f" | {'–' if best is None else f'{best:.2f}'} | {overall['identical']:.2f}"
            + f" | {overall.get('near_ties', 0)} | {overall.get('errors', 0)} |"
        )
    auto = summary.get("autoregressive")
    focus = [m for m in ("metasd", "oracle") if m in summary]
    if auto and focus:
        parts = [*TIME_PARTS, "other"]
        lines += [
            "",
            "Where the time goes (ms per generated token; autoregressive = its whole cost per token).",
            "",
            "| method | task | autoregressive | total | " + " | ".join(parts) + " | τ |",
            "|" + "---|" * (len(parts) + 5),
        ]
        for method in focus:
            for task in [*tasks, "overall"]:
                entry = summary[method].get(task)
                if not entry or "ms_per_token" not in entry:
                    continue
                base = auto[task]
                ms = entry["ms_per_token"]
                lines.append(
                    f"| {method} | {task} | {1000 * base['seconds'] / base['new_tokens']:.1f} | "
                    f"{1000 * entry['seconds'] / entry['new_tokens']:.1f} | "
                    + " | ".join(f"{ms[p]:.1f}" for p in parts)
                    + f" | {entry['mean_accepted_tokens']:.2f} |"
                )
    return "\n".join(lines) + "\n"


def _plots(
    summary: dict[str, Any], records: list[BenchRecord], names: list[str], tasks: list[str], out: Path
) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    methods = [m for m in summary if m != "autoregressive" and not m.startswith(("fixed[", "hf-assisted["))]
    best_hf = max(
        (m for m in summary if m.startswith("hf-assisted[")),
        key=lambda m: summary[m]["overall"]["speedup"],
        default=None,
    )
    best_fixed = max(
        (m for m in summary if m.startswith("fixed[")), key=lambda m: summary[m]["overall"]["speedup"], default=None
    )
    methods += [m for m in (best_fixed, best_hf) if m]
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(tasks) + 2), 4.5))
    width = 0.8 / max(1, len(methods))
    for j, method in enumerate(methods):
        values = [summary[method].get(t, {}).get("speedup", 0.0) for t in [*tasks, "overall"]]
        ax.bar([i + j * width for i in range(len(tasks) + 1)], values, width, label=method, color=plt.cm.tab20(j % 20))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(tasks) + 1)], [*tasks, "overall"], rotation=20)
    ax.set_ylabel("speedup vs autoregressive")
    ax.set_title("Speedup per task (greedy, same prompts, same run)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)
    written.append("speedup.png")

    picks = []
    for task in tasks:
        rows = [r for r in records if r.method == "metasd" and r.task == task and r.arms]
        if rows:
            picks.append(rows[0])
    if picks:
        fig, axes = plt.subplots(len(picks), 1, figsize=(9, 1.2 + 1.1 * len(picks)), sharex=True, squeeze=False)
        for ax, rec in zip(axes[:, 0], picks):
            ax.step(range(len(rec.arms)), rec.arms, where="mid", color="tab:blue")
            if rec.task in names:
                ax.axhline(names.index(rec.task), color="tab:green", linestyle=":", linewidth=1)
            labels = [*names, "no_draft"]
            ax.set_yticks(range(len(labels)), labels, fontsize=6)
            ax.set_ylabel(rec.task, fontsize=8)
        axes[-1, 0].set_xlabel("round")
        fig.suptitle("Arm chosen per round by MetaSD's defaults (dotted: the task's own drafter)", fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "arms.png", dpi=120)
        plt.close(fig)
        written.append("arms.png")
    return written


def write_report(
    records: list[BenchRecord], drafter_names: Sequence[str], out_dir: str | os.PathLike, *, meta: dict[str, Any]
) -> dict[str, Any]:
    """Write `results.json`, `results.md` and PNG plots into `out_dir`; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(drafter_names)
    tasks = list(dict.fromkeys(r.task for r in records))
    summary = summarize(records, names)
    report = {
        "meta": {**meta, "machine": machine(), "drafters": names},
        "summary": summary,
        "records": [asdict(r) for r in records],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (out / "results.md").write_text(_markdown(summary, tasks))
    traces = {f"{r.method}|{r.prompt_id}": r.trace for r in records if r.trace}
    if traces:  # replay with `hf_metasd.benchmark.simulate.replay(policy, traces[key])`
        (out / "traces.json").write_text(json.dumps(traces))
    report["plots"] = _plots(summary, records, names, tasks, out)
    return report
