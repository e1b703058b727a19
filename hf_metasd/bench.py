"""`hf-metasd bench`: MetaSD against autoregressive decoding, transformers' assisted generation, single drafters and
the task oracle, on Spec-Bench + HumanEval, greedy, on this machine.

Every method runs on the same prompts with the same `max_new_tokens`, interleaved prompt by prompt (machine noise
hits all methods alike). Every greedy output is compared with the autoregressive one; a mismatch makes the run fail
loudly after writing its results.

Metrics, per task and overall (Spec-Bench's names):

* ``mean_accepted_tokens`` (τ): tokens produced per target forward pass (accepted drafts + the target's own token),
  counted with a forward hook on the target, so it is defined for every method (autoregressive: 1).
* ``tokens_per_second``: new tokens / wall seconds.
* ``speedup``: autoregressive wall seconds / the method's wall seconds, summed over the task's prompts.
* ``best_arm_ratio``: share of MetaSD rounds drafted by the task's own drafter (drafters are named after tasks).
* ``identical``: share of outputs identical to autoregressive (must be 1.0).

The task oracle is ``fixed[<task>]``: MetaSD always drafting with the drafter trained for the prompt's task.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .drafters import Drafter
from .generation import generate as metasd_generate
from .policies import get_policy
from .prompts import BenchPrompt
from .stats import TIME_PARTS

__all__ = ["BenchRecord", "Method", "build_methods", "run_bench", "summarize", "write_report"]

#: Policies compared by default: (method name, policy, reward[, extra `generate` kwargs]).
DEFAULT_POLICIES = (
    ("ucb-bd", "ucb", "bd"),
    ("ucb-be", "ucb", "be"),
    ("exp3", "exp3", "bd"),
    ("successive_halving", "successive_halving", "bd"),
    ("thompson", "thompson", "bd"),
    ("random", "random", "bd"),
    ("ucb-bd+warm", "ucb", "bd", {"meta_warm_start": 16}),
    ("ucb-cost", "ucb", "cost"),
    ("ucb-bd (stock gemm)", "ucb", "bd", {"meta_skinny_gemm": False}),
    ("ucb-bd (beta=1)", "ucb", "bd", {"meta_policy_kwargs": {"beta": 1.0}}),
)


@dataclass
class Method:
    """One way to generate: `kind` is ``"autoregressive"``, ``"transformers"`` or ``"metasd"``.

    `kwargs(prompt)` returns the extra `generate` keyword arguments for a prompt (the oracle depends on its task).
    """

    name: str
    kind: str
    kwargs: Callable[[BenchPrompt], dict[str, Any]]
    #: for a method over part of the pool: the pool index of each of its drafters (telemetry arms are mapped back)
    arm_map: list[int] | None = None


@dataclass
class BenchRecord:
    """One (method, prompt) run."""

    method: str
    task: str
    prompt_id: str
    seconds: float
    new_tokens: int
    target_forwards: int
    identical: bool
    arms: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    time_split: dict[str, float] = field(default_factory=dict)
    trace: list[dict] = field(default_factory=list)


def transformers_assisted_kwargs(drafter: Drafter, num_assistant_tokens: int) -> dict[str, Any] | None:
    """The stock transformers `generate` arguments that draft like `drafter` (None if transformers has none).

    LoRA arms are merged into a private copy of their base (transformers cannot switch adapters); a restricted LM head
    is not available to transformers, so its assistant computes the full head.
    """
    kind = drafter.kind
    if kind == "prompt_lookup":
        return {
            "prompt_lookup_num_tokens": num_assistant_tokens,
            "max_matching_ngram_size": drafter.max_matching_ngram_size,
        }
    if kind == "early_exit":
        return {"assistant_early_exit": drafter.num_layers, "num_assistant_tokens": num_assistant_tokens}
    if kind == "lora":
        model = copy.deepcopy(drafter.peft_model)
        model.set_adapter(drafter.adapter_name)
        model = model.merge_and_unload()
    elif kind == "assistant_model":
        model = drafter.model
    else:
        return None
    config = copy.deepcopy(model.generation_config)
    config.num_assistant_tokens = num_assistant_tokens
    config.num_assistant_tokens_schedule = "constant"  # draft exactly N tokens, as MetaSD does
    config.assistant_confidence_threshold = 0.0
    model.generation_config = config
    return {"assistant_model": model, "num_assistant_tokens": num_assistant_tokens}


def build_methods(
    drafters: Sequence[Drafter],
    *,
    num_assistant_tokens: int = 5,
    policies: Sequence[tuple] = DEFAULT_POLICIES,
    transformers_baselines: bool | str = "kinds",
    fixed_baselines: bool = True,
    oracle: bool = True,
    stream_policy: bool = False,
    full_information: bool = False,
    policy_kwargs: dict[str, dict[str, Any]] | None = None,
    sub_pools: Sequence[Sequence[str]] = (),
) -> list[Method]:
    """The methods of a benchmark run over `drafters` (see the module docstring).

    `full_information` adds Hedge fed with every drafter's reward each round; its per-round rewards are saved as
    traces (`traces.json`) that `hf_metasd.simulate.replay` reads. `policy_kwargs` maps a policy name to its
    settings (e.g. a pool's ``{"ucb": {"beta": 0.05}}``); a method's own ``meta_policy_kwargs`` take precedence.
    `sub_pools` adds, for each list of drafter names, UCB with the BD and the cost reward over those drafters only
    (named e.g. ``ucb-cost[general+prompt_lookup]``). `transformers_baselines`: stock assisted generation with ``"all"`` drafters, the first drafter of each kind
    (``"kinds"``, default: LoRA arms of one base differ only by their adapter) or ``"none"``.
    """
    names = [d.name for d in drafters]
    pool = list(drafters)
    n = num_assistant_tokens

    def metasd(members: list[Drafter] = pool, **extra: Any) -> Callable[[BenchPrompt], dict[str, Any]]:
        return lambda prompt: {
            "custom_generate": metasd_generate,
            "assistant_models": members,
            "num_assistant_tokens": n,
            "return_dict_in_generate": True,
            **extra,
        }

    methods = [Method("autoregressive", "autoregressive", lambda prompt: {})]
    if transformers_baselines is True or transformers_baselines == "all":
        baseline_drafters = list(drafters)
    elif transformers_baselines == "kinds":  # the first drafter of each kind (LoRA arms: the first adapter)
        baseline_drafters = list({d.kind: d for d in reversed(drafters)}.values())[::-1]
    elif transformers_baselines in (False, "none"):
        baseline_drafters = []
    else:
        raise ValueError(
            f"`transformers_baselines` must be 'all', 'kinds' or 'none', but is {transformers_baselines!r}. Pick one."
        )
    if baseline_drafters:
        for drafter in baseline_drafters:
            kwargs = transformers_assisted_kwargs(drafter, n)
            if kwargs is not None:
                methods.append(Method(f"hf-assisted[{drafter.name}]", "transformers", lambda prompt, k=kwargs: k))
    if fixed_baselines:  # the oracle is derived from these (`summarize`)
        for i, name in enumerate(names):
            methods.append(
                Method(f"fixed[{name}]", "metasd", metasd(meta_policy="fixed", meta_policy_kwargs={"arm": i}))
            )
    elif oracle:

        def oracle_kwargs(prompt: BenchPrompt) -> dict[str, Any]:
            if prompt.task not in names:
                raise ValueError(
                    f"the oracle needs a drafter named {prompt.task!r}, but the pool has {names}. "
                    "Name task drafters after their task, or pass `oracle=False`."
                )
            return metasd(meta_policy="fixed", meta_policy_kwargs={"arm": names.index(prompt.task)})(prompt)

        methods.append(Method("oracle", "metasd", oracle_kwargs))
    settings = dict(policy_kwargs or {})
    for method_name, policy, reward, *extra in policies:
        kwargs = {"meta_policy_kwargs": dict(settings.get(policy, {})), **(extra[0] if extra else {})}
        methods.append(Method(method_name, "metasd", metasd(meta_policy=policy, meta_reward=reward, **kwargs)))
    for sub in sub_pools:
        unknown = [name for name in sub if name not in names]
        if unknown or not sub:
            raise ValueError(
                f"`sub_pools` entries must name drafters of the pool {names}, but {list(sub)} has {unknown or 'none'}. "
                "Fix the names."
            )
        index = [names.index(name) for name in sub]
        members = [pool[i] for i in index]
        for reward in ("bd", "cost"):
            kwargs = metasd(
                members, meta_policy="ucb", meta_reward=reward, meta_policy_kwargs=dict(settings.get("ucb", {}))
            )
            # the sub-pool's no-draft arm (after its drafters) is the pool's (after all of them)
            arm_map = [*index, len(names)]
            methods.append(Method(f"ucb-{reward}[{'+'.join(sub)}]", "metasd", kwargs, arm_map=arm_map))
    if full_information:  # every drafter scored every round: traces for `hf_metasd.simulate.replay`
        methods.append(
            Method(
                "hedge (full info)",
                "metasd",
                metasd(meta_policy="hedge", meta_full_information=True, meta_reward="bd"),
            )
        )
    if stream_policy:
        shared = get_policy("ucb", **settings.get("ucb", {}))
        methods.append(Method("ucb-bd (stream)", "metasd", metasd(meta_policy=shared, meta_reward="bd")))
    return methods


def _count_forwards(model: torch.nn.Module) -> tuple[list[int], Any]:
    calls = [0]

    def hook(*_: Any) -> None:
        calls[0] += 1

    return calls, model.register_forward_pre_hook(hook)


def run_bench(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[BenchPrompt],
    methods: Sequence[Method],
    *,
    max_new_tokens: int = 64,
    progress: bool = True,
    encode: Callable[[Any, str], torch.Tensor] | None = None,
) -> list[BenchRecord]:
    """Run every method on every prompt (interleaved), greedy; return one record per (method, prompt)."""
    from tqdm.auto import tqdm

    if encode is None:
        from .offline import chat_prompt as encode
    records: list[BenchRecord] = []
    calls, handle = _count_forwards(target)
    common = {"do_sample": False, "max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens}
    if tokenizer is not None and tokenizer.pad_token_id is not None:
        common["pad_token_id"] = tokenizer.pad_token_id
    try:
        bar = tqdm(total=len(prompts) * len(methods), desc="bench", disable=not progress)
        for prompt in prompts:
            ids = encode(tokenizer, prompt.text)
            reference = None
            for method in methods:
                bar.set_postfix_str(f"{prompt.task} {method.name}"[:40])
                calls[0] = 0
                start = time.perf_counter()
                out = target.generate(ids, **common, **method.kwargs(prompt))
                seconds = time.perf_counter() - start
                sequences = out.sequences if hasattr(out, "sequences") else out
                if reference is None:
                    reference = sequences
                stats = getattr(out, "metasd", None)
                records.append(
                    BenchRecord(
                        method=method.name,
                        task=prompt.task,
                        prompt_id=prompt.id,
                        seconds=seconds,
                        new_tokens=int(sequences.shape[1] - ids.shape[1]),
                        target_forwards=calls[0],
                        identical=bool(torch.equal(sequences, reference)),
                        arms=[a if method.arm_map is None else method.arm_map[a] for a in stats.arms]
                        if stats is not None
                        else [],
                        accepted=list(stats.accepted) if stats is not None else [],
                        time_split={k: getattr(stats, f"{k}_seconds") for k in TIME_PARTS} if stats else {},
                        trace=stats.to_trace() if stats is not None and stats.counterfactual_rewards else [],
                    )
                )
                bar.update(1)
        bar.close()
    finally:
        handle.remove()
    return records


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
    if "oracle" not in by_method:
        oracle = [r for r in records if r.method == f"fixed[{r.task}]"]
        if oracle:
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


def _machine() -> dict[str, Any]:
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
    header = "| method | " + " | ".join(tasks) + " | overall speedup | τ | tokens/s | best-arm | identical |"
    lines = [
        "Speedup vs autoregressive per task (wall-time ratio, same prompts, same run); τ = tokens per target forward.",
        "",
        header,
        "|" + "---|" * (len(tasks) + 6),
    ]
    for method, entry in summary.items():
        cells = [f"{entry[t]['speedup']:.2f}" if t in entry else "–" for t in tasks]
        overall = entry["overall"]
        best = overall.get("best_arm_ratio")
        lines.append(
            f"| {method} | "
            + " | ".join(cells)
            + f" | {overall['speedup']:.2f} | {overall['mean_accepted_tokens']:.2f} | {overall['tokens_per_second']:.1f}"
            + f" | {'–' if best is None else f'{best:.2f}'} | {overall['identical']:.2f} |"
        )
    auto = summary.get("autoregressive")
    focus = [m for m in ("ucb-bd", "oracle") if m in summary]
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
        rows = [r for r in records if r.method == "ucb-bd" and r.task == task and r.arms]
        if rows:
            picks.append(rows[0])
    if picks:
        fig, axes = plt.subplots(len(picks), 1, figsize=(9, 1.2 + 1.1 * len(picks)), sharex=True, squeeze=False)
        for ax, rec in zip(axes[:, 0], picks):
            ax.step(range(len(rec.arms)), rec.arms, where="mid", color="tab:blue")
            if rec.task in names:
                ax.axhline(names.index(rec.task), color="tab:green", linestyle=":", linewidth=1)
            ax.set_yticks(range(len(names)), names, fontsize=6)
            ax.set_ylabel(rec.task, fontsize=8)
        axes[-1, 0].set_xlabel("round")
        fig.suptitle("Drafter chosen per round by UCB-BD (dotted: the task's own drafter)", fontsize=10)
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
        "meta": {**meta, "machine": _machine(), "drafters": names},
        "summary": summary,
        "records": [asdict(r) for r in records],
    }
    (out / "results.json").write_text(json.dumps(report, indent=2, sort_keys=True))
    (out / "results.md").write_text(_markdown(summary, tasks))
    traces = {f"{r.method}|{r.prompt_id}": r.trace for r in records if r.trace}
    if traces:  # replay with `hf_metasd.simulate.replay(policy, traces[key])`
        (out / "traces.json").write_text(json.dumps(traces))
    report["plots"] = _plots(summary, records, names, tasks, out)
    return report
