r"""The figures the "never slower" goals are stated in, read from a bench run's `results.json` (no model runs).

For one method (default `metasd`): its overall and per-task speedup over autoregressive decoding, its slowest
prompts (ratio of the prompt's autoregressive seconds to the method's), the best single fixed drafter overall and
the method's ratio to it, its ratio to the per-task oracle (the best `fixed[...]` on each task), and the share of its
wall time spent in the policy, the reward, the kernel choice and replayed rounds. Every figure is a ratio of two
measurements of the same run.

``--diagnose`` adds, for each task and overall, what the ratio to the reference (the task's oracle; overall the best
single fixed drafter) is made of. With identical outputs both methods produce the same tokens, so with :math:`F`
target passes and :math:`S` seconds

.. math::

    \frac{S_{ref}}{S_m} = \underbrace{\frac{F_{ref}}{F_m}}_{\text{fewer passes } (= \tau_m / \tau_{ref})}
    \times \underbrace{\frac{S_{ref} / F_{ref}}{S_m / F_m}}_{\text{cheaper passes}}

and the seconds per pass split into the target's verification, drafting (drafting, catch-up, the drafters' prompt
prefill), MetaSD's own work (policy, reward, kernel choice, replayed rounds) and the rest (transformers' loop),
with the tokens each pass verified (1 + drafted; records written before the bench kept ``drafted`` show none). A
ratio below 1 whose pass ratio is at least 1 is lost on the cost of a pass, not on the choice of drafter.

    hf-metasd bench --mixed --out bench_results/mixed8
    python recipes/benchmarks/bench_goals.py bench_results/mixed8/results.json
    python recipes/benchmarks/bench_goals.py bench_results/mixed8/results.json --diagnose
    python recipes/benchmarks/bench_goals.py bench_results/mixed8/results.json --method "metasd (fixed draft length)"
    python recipes/benchmarks/bench_goals.py bench_results/qwen6/results.json --arms

``--arms`` adds each arm drafting alone (its ``fixed[...]`` records): accepted tokens per round, drafted tokens per
round, the share of drafted tokens accepted, the cost ratio :math:`c` (drafting seconds per drafted token over the
seconds of a plain step, autoregressive seconds per target pass) and its prompt prefill per call; and how many rounds
`method` gave each arm.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def goals(results: dict, method: str = "metasd") -> dict:
    """The goal figures of `method` (see the module docstring) from a loaded `results.json`."""
    summary = results["summary"]
    records = results["records"]
    seconds = defaultdict(dict)  # method -> prompt id -> seconds
    for r in records:
        seconds[r["method"]][r["prompt_id"]] = r["seconds"]
    plain = seconds["autoregressive"]
    per_prompt = sorted((plain[p] / s, p) for p, s in seconds[method].items())
    overall = summary[method]["overall"]["speedup"]
    tasks = [t for t in summary[method] if t != "overall"]
    fixed = {m: v for m, v in summary.items() if m.startswith("fixed[")}
    best_fixed = max(fixed, key=lambda m: fixed[m]["overall"]["speedup"]) if fixed else None
    oracle = {}
    for task in tasks:
        best = max(fixed, key=lambda m: fixed[m][task]["speedup"])
        oracle[task] = (summary[method][task]["speedup"] / fixed[best][task]["speedup"], best)
    split = defaultdict(float)
    wall = 0.0
    for r in records:
        if r["method"] == method:
            wall += r["seconds"]
            for part, value in (r.get("time_split") or {}).items():
                split[part] += value
    share = {part: 100 * split.get(part, 0.0) / wall for part in ("policy", "reward", "kernel_choice", "replay")}
    return {
        "method": method,
        "overall": overall,
        "per_task": {task: summary[method][task]["speedup"] for task in tasks},
        "slowest_prompts": per_prompt[:3],
        "best_fixed": (best_fixed, fixed[best_fixed]["overall"]["speedup"]) if best_fixed else None,
        "vs_best_fixed": overall / fixed[best_fixed]["overall"]["speedup"] if best_fixed else None,
        "vs_oracle_per_task": oracle,
        "vs_oracle_overall": overall / summary["oracle"]["overall"]["speedup"] if "oracle" in summary else None,
        "overhead_percent": share,
    }


#: time_split parts -> the diagnosis's share of a pass
PARTS = {
    "verify": ("verify",),
    "drafting": ("draft", "catch_up", "prefill"),
    "metasd": ("policy", "reward", "kernel_choice", "replay"),
}


def _totals(records: list[dict]) -> dict:
    """Seconds, passes, rounds, drafted tokens and seconds per part of `records` (one method, one or more tasks)."""
    out = {"seconds": 0.0, "passes": 0, "rounds": 0, "drafted": 0, **dict.fromkeys(PARTS, 0.0)}
    for r in records:
        out["seconds"] += r["seconds"]
        out["passes"] += r["target_forwards"]
        drafted = r.get("drafted") or []
        out["rounds"] += len(drafted)
        out["drafted"] += sum(drafted)
        split = r.get("time_split") or {}
        for part, names in PARTS.items():
            out[part] += sum(split.get(name, 0.0) for name in names)
    return out


def _per_pass(t: dict) -> dict:
    """Milliseconds per target pass by part (``other``: the rest of the wall time) and tokens verified per pass."""
    timed = sum(t[part] for part in PARTS)
    ms = {part: 1000 * t[part] / t["passes"] for part in PARTS}
    ms["other"] = 1000 * (t["seconds"] - timed) / t["passes"] if timed else 0.0
    ms["total"] = 1000 * t["seconds"] / t["passes"]
    ms["verified"] = 1 + t["drafted"] / t["rounds"] if t["rounds"] else None
    return ms


def diagnose(results: dict, method: str = "metasd") -> dict:
    """Per task (against that task's best `fixed[...]`) and overall (against the best one overall): the ratio of
    `method`'s speed to the reference's, split into fewer passes times cheaper passes (see the module docstring).

    Returns ``{task or "overall": {"reference", "ratio", "pass_ratio", "cost_ratio", "method_ms", "reference_ms"}}``
    where ``ratio == pass_ratio * cost_ratio`` and the ``*_ms`` are `_per_pass` of each side.
    """
    by = defaultdict(list)  # (method, task) -> records
    for r in results["records"]:
        by[r["method"], r["task"]].append(r)
        by[r["method"], "overall"].append(r)
    g = goals(results, method)
    references = {task: name for task, (_, name) in g["vs_oracle_per_task"].items()}
    if g["best_fixed"]:
        references["overall"] = g["best_fixed"][0]
    out = {}
    for task, reference in references.items():
        m, ref = _totals(by[method, task]), _totals(by[reference, task])
        pass_ratio = ref["passes"] / m["passes"]
        cost_ratio = (ref["seconds"] / ref["passes"]) / (m["seconds"] / m["passes"])
        out[task] = {
            "reference": reference,
            "ratio": pass_ratio * cost_ratio,
            "pass_ratio": pass_ratio,
            "cost_ratio": cost_ratio,
            "method_ms": _per_pass(m),
            "reference_ms": _per_pass(ref),
        }
    return out


def arms(results: dict, method: str = "metasd") -> dict:
    """Each arm drafting alone, from its ``fixed[...]`` records, and `method`'s rounds per arm (``--arms`` above).

    Returns ``{"plain_step": seconds, "alone": {name: {"accepted", "drafted", "acceptance", "c", "prefill"}},
    "rounds": {arm index: rounds}}``.
    """
    records = results["records"]
    auto = [r for r in records if r["method"] == "autoregressive"]
    plain_step = sum(r["seconds"] for r in auto) / sum(r["target_forwards"] for r in auto)
    alone = {}
    for name in sorted({r["method"] for r in records if r["method"].startswith("fixed[")}):
        rs = [r for r in records if r["method"] == name]
        rounds = sum(len(r.get("drafted") or []) for r in rs)
        drafted = sum(sum(r.get("drafted") or []) for r in rs)
        accepted = sum(sum(r.get("accepted") or []) for r in rs)
        draft = sum((r.get("time_split") or {}).get("draft", 0.0) for r in rs)
        alone[name] = {
            "accepted": accepted / rounds if rounds else 0.0,
            "drafted": drafted / rounds if rounds else 0.0,
            "acceptance": accepted / drafted if drafted else 0.0,
            "c": draft / drafted / plain_step if drafted else None,
            "prefill": sum((r.get("time_split") or {}).get("prefill", 0.0) for r in rs) / len(rs),
        }
    pulls: dict[int, int] = defaultdict(int)
    for r in records:
        if r["method"] == method:
            for arm in r.get("arms") or []:
                pulls[arm] += 1
    return {"plain_step": plain_step, "alone": alone, "rounds": dict(sorted(pulls.items()))}


def _print_diagnosis(d: dict, method: str) -> None:
    def ms(v: dict) -> str:
        verified = "  -  " if v["verified"] is None else f"{v['verified']:.2f}"
        parts = " ".join(f"{v[p]:6.1f}" for p in (*PARTS, "other", "total"))
        return f"{parts} {verified}"

    print(f"\n{method} against the reference, per task; ms per target pass: verify drafting metasd other total;")
    print("tokens verified per pass")
    for task, v in d.items():
        print(
            f"  {task:<15} {v['ratio']:.3f} = {v['pass_ratio']:.3f} (passes) x {v['cost_ratio']:.3f} (cost per pass)"
            f" vs {v['reference']}"
        )
        print(f"  {'':<15} {method[:22]:<22} {ms(v['method_ms'])}")
        print(f"  {'':<15} {v['reference'][:22]:<22} {ms(v['reference_ms'])}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a bench run's results.json")
    p.add_argument("--method", default="metasd")
    p.add_argument("--diagnose", action="store_true", help="split each ratio into fewer and cheaper passes")
    p.add_argument("--arms", action="store_true", help="each arm drafting alone, and the method's rounds per arm")
    args = p.parse_args(argv)
    results = json.loads(args.results.read_text())
    g = goals(results, args.method)
    print(f"{g['method']}: {g['overall']:.3f}x plain overall")
    print("  per task: " + ", ".join(f"{t} {v:.2f}" for t, v in g["per_task"].items()))
    print("  slowest prompts: " + ", ".join(f"{p} {v:.3f}" for v, p in g["slowest_prompts"]))
    if g["best_fixed"]:
        name, value = g["best_fixed"]
        print(f"  best single fixed drafter: {name} {value:.3f}x -> ratio {g['vs_best_fixed']:.3f}")
        print(
            "  vs per-task oracle: "
            + ", ".join(f"{t} {v:.3f} ({m})" for t, (v, m) in g["vs_oracle_per_task"].items())
            + (f"; overall {g['vs_oracle_overall']:.3f}" if g["vs_oracle_overall"] else "")
        )
    print("  share of wall time (%): " + ", ".join(f"{k} {v:.2f}" for k, v in g["overhead_percent"].items()))
    if args.diagnose and g["best_fixed"]:
        _print_diagnosis(diagnose(results, args.method), args.method)
    if args.arms:
        a = arms(results, args.method)
        print(f"\neach arm alone (plain step {1000 * a['plain_step']:.0f} ms):")
        for name, v in a["alone"].items():
            c = "-" if v["c"] is None else f"{v['c']:.3f}"
            print(
                f"  {name:<30} accepted/round {v['accepted']:.2f}, drafted/round {v['drafted']:.2f}, "
                f"accepted {100 * v['acceptance']:.0f} %, c = {c}, prefill {v['prefill']:.2f} s per call"
            )
        print(f"  {args.method} rounds per arm: {a['rounds']}")


if __name__ == "__main__":
    main()
