"""``hf-metasd bench --batch-size B``: MetaSD on batches of `B` prompts against plain batched `generate` on the same
batches (left-padded), tokens per second of the batch, every row's output checked against plain's under its dtype's
contract (`hf_metasd.lossless`: identical, or in bfloat16 leaving it only at a near-tie; `hf_metasd.batched`)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..reward_memory import reward_memory_scope
from .prompts import BenchPrompt

__all__ = ["BatchRecord", "left_pad", "run_batch_bench", "write_batch_report"]


@dataclass
class BatchRecord:
    """One batch, timed with both methods."""

    prompt_ids: list[str]
    new_tokens: int  # tokens of the batch's output after the prompts (every row: the same, `min_new_tokens` is set)
    plain_seconds: float
    metasd_seconds: float
    identical: bool
    rounds: int = 0  # MetaSD's target passes
    verified_rows: int = 0  # token rows MetaSD's passes verified (rows x columns): grows with B x draft length
    mean_draft: float = 0.0  # tokens drafted per row and round (near 0: the rows fell back to no draft)
    wasted_slots: list[int] = field(default_factory=list)
    arms: list[dict[str, int]] = field(default_factory=list)  # per row: arm name -> rounds
    drafting_stopped_after: int | None = None  # the batch stopped drafting after so many rounds (None: it did not)
    #: per row, where MetaSD's output first left plain's (`hf_metasd.lossless.Divergence.to_dict`; None: identical)
    divergences: list[dict | None] = field(default_factory=list)

    @property
    def near_ties(self) -> int:
        """Rows that left plain's output at a near-tie."""
        return sum(1 for d in self.divergences if d is not None and d["near_tie"])

    @property
    def lossless(self) -> bool:
        """Every row identical to plain's, or leaving it only at a near-tie."""
        return all(d is None or d["near_tie"] for d in self.divergences)

    @property
    def speedup(self) -> float:
        return self.plain_seconds / self.metasd_seconds if self.metasd_seconds else float("nan")


def left_pad(rows: Sequence[torch.Tensor], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, attention_mask)`` of the ``(1, L_i)`` `rows`, left-padded with `pad_token_id` to the longest.

    Example:
        >>> left_pad([torch.tensor([[5, 6]]), torch.tensor([[7]])], 0)
        (tensor([[5, 6],
                [0, 7]]), tensor([[1, 1],
                [0, 1]]))
    """
    width = max(row.shape[-1] for row in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - row.shape[-1] :] = row.reshape(-1)
        mask[i, width - row.shape[-1] :] = 1
    return ids, mask


def run_batch_bench(
    target: Any,
    tokenizer: Any,
    prompts: Sequence[BenchPrompt],
    pool: Any,
    *,
    batch_size: int,
    max_new_tokens: int = 64,
    encode: Callable[[Any, str], torch.Tensor] | None = None,
    warm_up_tokens: int = 8,
    print_fn: Callable[[str], None] | None = None,
) -> list[BatchRecord]:
    """Split `prompts` into batches of `batch_size` (the last may be smaller); time plain batched `generate` and MetaSD
    with `pool` (its defaults) on each, greedy with ``min_new_tokens = max_new_tokens`` (every row the same length, as
    `run_bench` does). The first batch is first generated untimed with `warm_up_tokens` by both methods."""
    if encode is None:
        from .offline import chat_prompt as encode
    pad = 0
    if tokenizer is not None:
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batches = [list(prompts[i : i + batch_size]) for i in range(0, len(prompts), batch_size)]
    inputs = [left_pad([encode(tokenizer, p.text) for p in batch], pad) for batch in batches]
    if warm_up_tokens and batches:
        _both(target, pool, *inputs[0], pad, warm_up_tokens, "metasd-batch warm-up")
    records = []
    checker = None
    for number, (batch, (ids, mask)) in enumerate(zip(batches, inputs)):
        plain, plain_seconds, out, metasd_seconds = _both(target, pool, ids, mask, pad, max_new_tokens, "metasd-batch")
        divergences: list[dict | None] = [None] * len(batch)
        if not torch.equal(plain, out.sequences):
            checker = checker or _RowCheck(target)
            divergences = [checker(plain[i], out.sequences[i], mask[i]) for i in range(len(batch))]
        stats = out.metasd
        rows = getattr(stats, "rows", [stats])  # a batch of one gives one `MetaSDStats`
        records.append(
            BatchRecord(
                prompt_ids=[p.id for p in batch],
                new_tokens=int(plain.shape[0] * (plain.shape[1] - ids.shape[1])),
                plain_seconds=plain_seconds,
                metasd_seconds=metasd_seconds,
                identical=bool(torch.equal(plain, out.sequences)),
                rounds=stats.rounds,
                verified_rows=_verified_rows(stats, ids.shape[1]),
                mean_draft=sum(sum(row.drafted) for row in rows) / max(1, sum(row.rounds for row in rows)),
                wasted_slots=list(getattr(stats, "wasted_slots", [0])),
                arms=[_arm_counts(row) for row in rows],
                drafting_stopped_after=getattr(stats, "drafting_stopped_after", None),
                divergences=divergences,
            )
        )
        if print_fn is not None:
            r = records[-1]
            print_fn(
                f"batch {number}: {len(batch)} rows, {r.new_tokens} tokens, plain {r.plain_seconds:.2f}s, MetaSD "
                f"{r.metasd_seconds:.2f}s ({r.speedup:.2f}x), identical: {r.identical}"
                + (f" ({r.near_ties} rows left plain at a near-tie)" if r.near_ties else "")
                + f", {r.verified_rows} token rows "
                f"verified, {r.mean_draft:.2f} tokens drafted per row and round"
                + ("" if r.drafting_stopped_after is None else f", drafting stopped after {r.drafting_stopped_after}")
            )
    return records


def _both(
    target: Any, pool: Any, ids: torch.Tensor, mask: torch.Tensor, pad: int, tokens: int, scope: str
) -> tuple[torch.Tensor, float, Any, float]:
    """Plain batched `generate`, then MetaSD (in reward-memory scope `scope`), greedy, `tokens` new tokens per row:
    ``(plain ids, its seconds, MetaSD's output, its seconds)``."""
    from ..generation import generate as metasd_generate

    kwargs = {"do_sample": False, "pad_token_id": pad, "attention_mask": mask}
    kwargs |= {"max_new_tokens": tokens, "min_new_tokens": tokens}
    start = time.perf_counter()
    plain = target.generate(ids, **kwargs)
    plain_seconds = time.perf_counter() - start
    start = time.perf_counter()
    with reward_memory_scope(scope):  # what the timed calls learn stays theirs
        out = target.generate(
            ids, **kwargs, custom_generate=metasd_generate, assistant_models=pool, return_dict_in_generate=True
        )
    return plain, plain_seconds, out, time.perf_counter() - start


class _RowCheck:
    """`hf_metasd.lossless.check_divergence` of one left-padded row, its padding dropped; the float32 copy of the
    target is made once."""

    def __init__(self, target: Any) -> None:
        from ..lossless import float32_copy

        self.target, self.float32 = target, float32_copy(target)

    def __call__(self, plain: torch.Tensor, sequence: torch.Tensor, mask: torch.Tensor) -> dict | None:
        from ..lossless import check_divergence

        pads = int((mask == 0).sum())
        found = check_divergence(
            self.target, plain[None, pads:], sequence[None, pads:], int(mask.sum()), target_float32=self.float32
        )
        return None if found is None else found.to_dict()


def _verified_rows(stats: Any, prompt_length: int) -> int:
    """Token rows MetaSD's passes verified: a batch's (`MetaSDBatchStats.verified_rows`), or one request's (its
    prompt and first draft, then one token and a draft per round)."""
    if hasattr(stats, "verified_rows"):
        return stats.verified_rows
    return prompt_length + sum(stats.drafted) + stats.rounds - 1


def _arm_counts(stats: Any) -> dict[str, int]:
    names = [stats.drafter_names[a] for a in stats.arms]
    return {name: names.count(name) for name in dict.fromkeys(names)}


def write_batch_report(records: Sequence[BatchRecord], out: str | Path, meta: dict[str, Any]) -> str:
    """Write ``batch_results.json`` in `out` and return the summary line: tokens per second of both methods over
    every batch."""
    tokens = sum(r.new_tokens for r in records)
    plain, metasd = sum(r.plain_seconds for r in records), sum(r.metasd_seconds for r in records)
    line = (
        f"batch size {meta.get('batch_size')}: plain batched generate {tokens / plain:.1f} tokens/s, MetaSD "
        f"{tokens / metasd:.1f} tokens/s ({plain / metasd:.2f}x) over {len(records)} batches, "
        f"{sum(not r.identical for r in records)} batches differ from plain, "
        f"{sum(r.near_ties for r in records)} rows at a near-tie, "
        f"{sum(sum(d is not None and not d['near_tie'] for d in r.divergences) for r in records)} rows in error"
    )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    payload = {
        "meta": meta,
        "summary": line,
        "records": [asdict(r) | {"speedup": r.speedup, "lossless": r.lossless} for r in records],
    }
    (folder / "batch_results.json").write_text(json.dumps(payload, indent=1))
    return line
