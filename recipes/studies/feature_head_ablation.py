"""The feature-head recipe ablation's table: each run's held-out figures and paired differences against a reference.

Reads the ``training_record.json`` of `recipes/pools/train_feature_head.py` runs that share one held-out set (the
records keep, per held-out sequence, step 0's ``[hits, scored]`` and step 1's conditional ones). A paired difference
``r_a - r_b`` of two runs' ratios (hits / scored over all held-out sequences) gets the standard error of the
linearised ratio estimator over the same sequences (`recipes.pools.train_feature_head.paired_difference`, which
also decides which per-task adapters are kept).

Arguments ``RUN`` or ``RUN:REFERENCE``, each a record file; from the repository root::

    cd docs/assets/bench/feature_head_ablation
    python ../../../../recipes/studies/feature_head_ablation.py A-baseline.json E-kl.json:D-lmhead-tuned.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from recipes.pools.train_feature_head import paired_difference  # noqa: E402


def row(path: Path, reference: Path | None) -> str:
    """One markdown table row: step 0, conditional step 1 (with standard errors), full step 1, conditional step 2,
    held-out loss, training wall time, and the paired differences against `reference`."""
    last = json.loads(path.read_text())["epochs"][-1]
    seconds = last.get("seconds", float("nan"))
    line = (
        f"| {path.stem} | {last['agreement_step0']:.3f} ± {last['se_agreement_step0']:.3f} | "
        f"{last['conditional_step1']:.3f} ± {last['se_conditional_step1']:.3f} | {last['agreement_step1']:.3f} | "
        f"{last.get('conditional_step2', float('nan')):.3f} | {last['val_loss']:.2f} | {seconds:.0f} s |"
    )
    if reference is None:
        return line + " |"
    ref = json.loads(reference.read_text())["epochs"][-1]
    d0, s0 = paired_difference(last["per_sequence"], ref["per_sequence"], (0, 1))
    d1, s1 = paired_difference(last["per_sequence"], ref["per_sequence"], (2, 3))
    return line + f" {d0:+.3f} ± {s0:.3f} / {d1:+.3f} ± {s1:.3f} vs {reference.stem} |"


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="RUN or RUN:REFERENCE, each a training_record.json")
    args = p.parse_args(argv)
    lines = [
        "| run | step 0 | cond. step 1 | full step 1 | cond. step 2 | val loss | train wall "
        "| paired diff (step 0 / cond. 1) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for spec in args.runs:
        run, _, ref = spec.partition(":")
        lines.append(row(Path(run), Path(ref) if ref else None))
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
