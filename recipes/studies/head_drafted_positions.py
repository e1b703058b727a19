"""Does a feature head accept in `generate` what its held-out step-0 agreement says? Drafted positions, replayed.

For the first ``--per-task`` held-out prompts of each ``--tasks`` store (``<stores>/<task>.pt`` of
`recipes/pools/generate_task_outputs.py`; the first ``--val-sequences`` of a store are the ones
`train_feature_head.py` holds out), the default target (``--dtype``) generates ``--max-new-tokens`` greedily with the
head as the only drafter, one token per round (``num_assistant_tokens=1``, ``meta_draft_length="fixed"``, no no-draft
arm, no learned priors: every round drafts). Then the head's teacher-forced step 0 (`unrolled_logits`, as
`train_feature_head.evaluate` scores it) is computed over the same output, with the target's features from one
pass over it. Printed:

- ``generate``: accepted / drafted one-token drafts (`MetaSDStats`);
- ``teacher-forced, every answer position``: the head's step-0 agreement with the target's greedy token over the whole
  output (what the training record's ``agreement_step0`` measures);
- ``teacher-forced, at the drafted positions``: the same, only where a round drafted, and in how many rounds it
  differs from what `generate` accepted (0 up to near-ties in bfloat16 when the head drafts in `generate` what it
  was trained and measured on).

A round drafts after an accepted token plus the target's own, or after a correction: where those positions are
harder than the average one, ``generate`` accepts less than the held-out figure promises, with no fault in the
head. Run from the repository root (about a minute)::

    python recipes/studies/head_drafted_positions.py artifacts/head-own-e2 --dtype bfloat16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

import hf_metasd  # noqa: E402
from hf_metasd.drafters import FeatureHeadDrafter  # noqa: E402
from hf_metasd.feature_head import FeatureRecorder, load_feature_head  # noqa: E402
from recipes.pools.train_feature_head import unrolled_logits  # noqa: E402


@torch.no_grad()
def drafted_positions(target, head, prompt: list[int], max_new_tokens: int) -> dict[str, int]:
    """One greedy call with `head` drafting one token every round, and its teacher-forced step 0 over the output.

    Returns counts: ``drafted``, ``accepted`` (`generate`), ``scored`` / ``agree`` (every answer position after the
    first), ``agree_at_drafted`` (teacher-forced, where a round drafted) and ``differ`` (rounds where that and
    `generate`'s acceptance differ).
    """
    ids = torch.tensor([prompt])
    out = target.generate(
        ids,
        custom_generate=hf_metasd.generate,
        assistant_models=[FeatureHeadDrafter(head, name="head")],
        num_assistant_tokens=1,
        meta_draft_length="fixed",
        meta_no_draft=False,
        meta_learned_priors=False,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        return_dict_in_generate=True,
    )
    stats, sequence = out.metasd, out.sequences
    with FeatureRecorder(target, head.config.layer_ids) as recorder:
        labels = target(sequence).logits[0].argmax(-1)
    step0 = unrolled_logits(head, recorder.features().to(head.fc.weight.dtype), sequence, 1)[0][0]
    predicted = head.draft_to_target(step0.argmax(-1))  # entry c: the head's guess of token c + 2
    entries = torch.arange(len(prompt) - 1, sequence.shape[1] - 1)
    counts = {"drafted": 0, "accepted": 0, "agree_at_drafted": 0, "differ": 0}
    counts["scored"], counts["agree"] = len(entries), int((predicted[entries] == labels[entries + 1]).sum())
    position = len(prompt)  # the round's first new token
    for accepted, drafted, new in zip(stats.accepted, stats.drafted, stats.new_tokens, strict=True):
        if drafted == 1:
            agree = int(predicted[position - 2] == sequence[0, position])
            counts["drafted"] += 1
            counts["accepted"] += accepted
            counts["agree_at_drafted"] += agree
            counts["differ"] += int(agree != accepted)
        position += new
    return counts


def main(argv=None) -> dict[str, int]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("head", type=Path, help="a feature head folder (`save_head`'s layout)")
    p.add_argument("--stores", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs")
    p.add_argument("--tasks", nargs="+", default=["mt_bench", "qa", "code", "math_reasoning"])
    p.add_argument("--per-task", type=int, default=4, help="held-out prompts per task (at most --val-sequences)")
    p.add_argument("--val-sequences", type=int, default=15, help="the held-out sequences per store")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="the target's dtype")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if not 1 <= args.per_task <= args.val_sequences:
        p.error(f"`--per-task` must be 1 .. `--val-sequences` ({args.val_sequences}), but is {args.per_task}.")
    from hf_metasd.benchmark.offline import load_default_target

    torch.set_num_threads(args.threads)
    target, _ = load_default_target(getattr(torch, args.dtype))
    head = load_feature_head(str(args.head), target)
    totals: dict[str, int] = {}
    for task in args.tasks:
        for prompt in torch.load(args.stores / f"{task}.pt")["prompts"][: args.per_task]:
            for key, value in drafted_positions(target, head, list(prompt), args.max_new_tokens).items():
                totals[key] = totals.get(key, 0) + value
    d, s = max(totals["drafted"], 1), max(totals["scored"], 1)
    print(
        f"generate: {totals['accepted']} / {totals['drafted']} one-token drafts accepted ({totals['accepted'] / d:.3f})"
    )
    print(f"teacher-forced, every answer position: {totals['agree']} / {totals['scored']} ({totals['agree'] / s:.3f})")
    print(
        f"teacher-forced, at the drafted positions: {totals['agree_at_drafted']} / {totals['drafted']} "
        f"({totals['agree_at_drafted'] / d:.3f}); differs from generate in {totals['differ']} rounds"
    )
    return totals


if __name__ == "__main__":
    main()
