"""A tensor-parallel target (``tp_plan="auto"``, ``torchrun``, gloo on CPU): MetaSD's output is plain `generate`'s
on every rank, and every rank makes the same choices although each reads its own clock (`hf_metasd._distributed`).

The first tests launch `tests/tp_worker.py` on 2 ranks (about 10 s); the others check the agreement's wiring in this
process, with a one-rank process group and a broadcast that stands in for rank 0.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import sharpen, tiny_llama

import hf_metasd.stats
from hf_metasd._distributed import agree, agreeing, tensor_parallel_group
from hf_metasd.drafters.prefill import choose_prefill_dtype, clear_prefill_choices, float32_body
from hf_metasd.errors import MetaSDConfigError
from hf_metasd.kernels import choose_verification_kernel, clear_kernel_choices
from hf_metasd.policies import get_policy

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(), reason="torch.distributed with gloo is not available"
)

WORKER = Path(__file__).with_name("tp_worker.py")
RANKS = 2


# ---------------------------------------------------------------------------------------------------------------------
# two ranks under torchrun
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """What each rank of `tests/tp_worker.py` wrote: its outputs and its policy's choices."""
    folder = tmp_path_factory.mktemp("tensor_parallel")
    sharpen(tiny_llama(0)).save_pretrained(folder / "model")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
    command += [str(WORKER), str(folder / "model"), str(folder)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(RANKS)]


def test_metasd_on_a_tensor_parallel_target_is_plain_generate_on_every_rank(ranks):
    assert [r["tp_size"] for r in ranks] == [RANKS] * RANKS
    assert all(r["plain"] == ranks[0]["plain"] for r in ranks)
    for r in ranks:
        assert [call["sequence"] for call in r["custom_generate"]] == r["plain"]
        assert [call["sequence"] for call in r["thompson"]] == r["plain"]
        assert r["enable"] == r["plain"]


def test_every_rank_makes_rank_0s_choices(ranks):
    assert all(r["custom_generate"] == ranks[0]["custom_generate"] for r in ranks)
    assert all(r["thompson"] == ranks[0]["thompson"] for r in ranks)  # an unseeded policy draws the same arms
    used = {arm for call in ranks[0]["custom_generate"] for arm in call["arms"]}
    assert {0, 1, 2} <= used, "the pool's model drafter, prompt lookup and corpus drafter each drafted"


def test_left_to_their_own_clocks_the_ranks_would_choose_differently(ranks):
    """The test has teeth: each rank's clock differs, and on an unsharded copy of the target (where nothing is
    agreed) the policy of each rank chooses differently."""
    assert len({r["clock"] for r in ranks}) == RANKS
    assert ranks[0]["local"] != ranks[1]["local"]
    assert all([call["sequence"] for call in r["local"]] == r["plain"] for r in ranks)


# ---------------------------------------------------------------------------------------------------------------------
# the wiring, in this process
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture
def one_rank():
    """A one-rank gloo process group for the test (destroyed after it)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Sharded(torch.nn.Linear):
    """A stand-in for a target that transformers sharded across 2 ranks (`tp_size`, a device mesh with "tp")."""

    tp_size = RANKS

    def __init__(self) -> None:
        super().__init__(16, 64)
        self._device_mesh = dist.device_mesh.init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))


@pytest.fixture
def rank_0(one_rank, monkeypatch):
    """Broadcasts that hand this process "rank 0's" values (`values`) and random state (`state`); counts calls."""
    sent = {"values": None, "state": random.Random(5).getstate(), "calls": 0}

    def broadcast(tensor, group=None, group_src=None):
        sent["calls"] += 1
        tensor.copy_(torch.tensor(sent["values"](tensor.numel()), dtype=tensor.dtype))

    def broadcast_object_list(objects, group=None, group_src=None, device=None):
        sent["calls"] += 1
        objects[0] = sent["state"]

    monkeypatch.setattr(dist, "broadcast", broadcast)
    monkeypatch.setattr(dist, "broadcast_object_list", broadcast_object_list)
    return sent


def test_an_unsharded_target_agrees_on_nothing(target, rank_0):
    assert tensor_parallel_group(target) is None and agree([0.5, 2.0], target) == [0.5, 2.0]
    policy = get_policy("thompson")
    state = policy._rng.getstate()
    with agreeing(target, policy):
        hf_metasd.stats.MetaSDStats(["d"], "ucb", "bd", 3).clock()
    assert rank_0["calls"] == 0 and policy._rng.getstate() == state


def test_a_call_on_a_sharded_target_reads_rank_0s_clock_and_random_state(rank_0):
    rank_0["values"] = lambda n: [42.0] * n
    policy = get_policy("thompson")
    policy.bind(3)
    with agreeing(Sharded(), policy):
        assert hf_metasd.stats.MetaSDStats(["d"], "ucb", "bd", 3).clock() == 42.0
    assert policy._rng.getstate() == rank_0["state"]
    assert hf_metasd.stats.MetaSDStats(["d"], "ucb", "bd", 3).clock() != 42.0  # after the call: this rank's own


@pytest.mark.parametrize(("stock", "skinny", "kernel"), [(1.0, 0.5, "skinny"), (1.0, 2.0, "stock")])
def test_the_kernel_choice_is_rank_0s(rank_0, stock, skinny, kernel):
    rank_0["values"] = lambda n: [stock, skinny]
    clear_kernel_choices()
    try:
        assert choose_verification_kernel(Sharded(), [4]).kernel == kernel
    finally:
        clear_kernel_choices()


@pytest.mark.parametrize(("float32_per_token", "min_tokens"), [(0.1, 2), (10.0, None)])
def test_the_prefill_choice_is_rank_0s(rank_0, float32_per_token, min_tokens):
    # rank 0's best times, in the order of their sorted keys: (float32, 4), (float32, 20), (stored, 4), (stored, 20)
    rank_0["values"] = lambda n: [4 * float32_per_token, 20 * float32_per_token, 4.0, 20.0]
    model = sharpen(tiny_llama(2, layers=1)).bfloat16()
    clear_prefill_choices()
    try:
        with agreeing(Sharded(), get_policy("ucb")):
            assert choose_prefill_dtype(model, float32_body(model)).min_tokens == min_tokens
    finally:
        clear_prefill_choices()


def test_a_sharded_target_without_its_device_mesh_is_refused(one_rank):
    model = Sharded()
    model._device_mesh = None
    with pytest.raises(MetaSDConfigError, match=r"a target with `tp_size` 2 must carry transformers' device mesh"):
        tensor_parallel_group(model)
    assert tensor_parallel_group(Sharded()) is not None  # with its mesh
