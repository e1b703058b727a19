"""The figures the "never slower" goals are stated in, read from a bench run's `results.json` (no model runs).

For one method (default `metasd`): its overall and per-task speedup over autoregressive decoding, its slowest
prompts (ratio of the prompt's autoregressive seconds to the method's), the best single fixed drafter overall and
the method's ratio to it, its ratio to the per-task oracle (the best `fixed[...]` on each task), and the share of its
wall time spent in the policy, the reward, the kernel choice and replayed rounds. Every figure is a ratio of two
measurements of the same run.

    hf-metasd bench --mixed --out bench_results/mixed8
    python recipes/bench_goals.py bench_results/mixed8/results.json
    python recipes/bench_goals.py bench_results/mixed8/results.json --method "metasd (fixed draft length)"
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="a bench run's results.json")
    p.add_argument("--method", default="metasd")
    args = p.parse_args(argv)
    g = goals(json.loads(args.results.read_text()), args.method)
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


if __name__ == "__main__":
    main()
