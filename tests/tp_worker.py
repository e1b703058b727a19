"""One rank of `tests/test_tensor_parallel.py`: a tensor-parallel target under ``torchrun`` (gloo, CPU).

Run as ``python -m torch.distributed.run --standalone --nproc-per-node 2 tests/tp_worker.py MODEL OUT``. Each rank
loads the tiny Llama saved in MODEL with ``tp_plan="auto"`` (its weights sharded across the ranks), runs plain greedy
`generate` and MetaSD (both entry points, a pool of a replicated model drafter, prompt lookup and a corpus drafter),
and writes its outputs and the policy's choices to ``OUT/rank<r>.json``.

Every rank reads its own fake clock (`conftest.FakeClock`), charged so that the model drafter is cheap on rank 0 and
dear on rank 1: left to their own clocks the ranks would choose differently. ``local`` records what this rank's
policy chooses on an unsharded copy of the target (no agreement applies there), to show that they do.
"""

from __future__ import annotations

import json
import sys
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from conftest import FakeClock, prompts
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

import hf_metasd
import hf_metasd.stats
from hf_metasd.drafters import CorpusDrafter, PromptLookupDrafter

MAX_NEW = 20
#: the target's cost by the tokens a pass is fed (the last entry: longer passes, the prompt's prefill)
TARGET_COSTS = [1.0, 1.1, 1.2, 1.3, 1.4, 3.0]
#: the model drafter's cost per forward, by rank: cheap on rank 0, dearer than a target pass on rank 1
DRAFTER_COSTS = [0.05, 4.0]
#: the telemetry that must be the same on every rank
CHOICES = ("arms", "drafted", "accepted", "new_tokens", "rewards", "abstained", "kernels", "match_classes")


def _prompts() -> list[torch.Tensor]:
    """Random prompts, each followed by a repeat of its start (so that prompt lookup finds matches)."""
    return [torch.cat([p, p[:, :4]], dim=-1) for p in prompts(3, seed=7, min_len=6, max_len=10)]


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))  # a divergence fails fast instead of hanging
    rank = dist.get_rank()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        target = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=DistributedConfig(tp_plan="auto"))
    local_target = AutoModelForCausalLM.from_pretrained(model_dir)  # the same weights, whole, on this rank only
    drafter = AutoModelForCausalLM.from_pretrained(model_dir)  # a copy of the target, replicated on every rank
    clock = FakeClock()
    hf_metasd.stats.CLOCK = clock
    inputs = _prompts()
    plain = [target.generate(ids, do_sample=False, max_new_tokens=MAX_NEW)[0].tolist() for ids in inputs]
    corpus = plain[1:]  # the target's own continuations of the other prompts: a corpus that matches
    for model in (target, local_target):
        clock.charge(model, TARGET_COSTS)
    clock.charge(drafter, DRAFTER_COSTS[rank])

    def pool() -> list:
        return [drafter, PromptLookupDrafter(), CorpusDrafter.from_sequences(corpus, name="corpus")]

    def metasd(model, ids, **kwargs) -> dict:
        out = model.generate(
            ids,
            do_sample=False,
            max_new_tokens=MAX_NEW,
            custom_generate=hf_metasd.generate,
            assistant_models=pool(),
            return_dict_in_generate=True,
            **kwargs,
        )
        return {"sequence": out.sequences[0].tolist(), **{name: getattr(out.metasd, name) for name in CHOICES}}

    record = {"rank": rank, "tp_size": target.tp_size, "plain": plain}
    record["custom_generate"] = [metasd(target, ids) for ids in inputs]
    record["thompson"] = [metasd(target, ids, meta_policy="thompson") for ids in inputs]  # unseeded: its own draws
    record["local"] = [metasd(local_target, ids) for ids in inputs]  # nothing to agree with: this rank's choices
    hf_metasd.enable()
    try:
        outputs = [
            target.generate(ids, do_sample=False, max_new_tokens=MAX_NEW, assistant_models=pool()) for ids in inputs
        ]
        record["enable"] = [out[0].tolist() for out in outputs]
    finally:
        hf_metasd.disable()
    record["clock"] = clock.now  # this rank's own clock: not the other's
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
