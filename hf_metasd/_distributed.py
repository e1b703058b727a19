r"""Tensor parallelism: every rank of a sharded target makes the same MetaSD decisions.

A target loaded with ``tp_plan="auto"`` under ``torchrun`` runs one forward pass on every rank at once, each rank
holding a shard of its weights and meeting the others in collectives (all-reduce, all-gather). So every rank must
feed it the same tokens: the same drafter, the same draft length, the same verification kernel, every round. MetaSD
decides those from measurements (the `speed` reward, the costs of `hf_metasd.costs`, the draft lengths of
`hf_metasd.draft_length`, the per-pass kernels of `hf_metasd.kernels`, the float32 prefill of
`hf_metasd.drafters.prefill`) and from the policy's random generator, and each rank measures its own wall clock and
seeds its own generator: left alone, the ranks would choose differently, feed the target passes of different lengths
and deadlock in a collective (or, with passes of equal length, silently sum the shards of different tokens).

The ranks therefore agree, for the duration of a call on a sharded target (`agreeing`, entered by
`hf_metasd.generate` around the decoding loop):

* every reading of the call's clock (`hf_metasd.stats`) is rank 0's: one broadcast of one number per reading, so
  that every measured cost, reward and length, and everything decided from them, is the same on every rank;
* the policy's random generator starts from rank 0's state (one broadcast per call): a policy that draws (``random``,
  ``thompson``, ``epsilon_greedy``, ``exp3``, ``hedge``) draws the same arms;
* measured one-off choices (the verification kernel, a drafter's float32 prefill) are rank 0's (`agree`).

A call on a target that is not sharded (no ``torch.distributed``, or a ``tp_size`` of 1) does none of this: the
clock is read as it is and nothing is broadcast. Each rank must still run the same calls on the same inputs (as plain
`generate` under tensor parallelism requires), and under sampling seed torch's generator identically on every rank
(the drafters and the target sample from it).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import torch

from .errors import MetaSDConfigError

__all__ = ["agree", "agreeing", "tensor_parallel_group"]

#: The process group of the call being decoded on a sharded target (None: not sharded, or no call).
_GROUP: ContextVar[Any] = ContextVar("hf_metasd_tensor_parallel_group", default=None)


def tensor_parallel_group(model: Any) -> Any:
    """The process group across which `model`'s weights are sharded (transformers' ``tp_plan``), or ``None`` when
    `model` is not sharded (no ``torch.distributed`` process group, or ``model.tp_size`` is ``None`` or 1).

    Example:
        >>> tensor_parallel_group(torch.nn.Linear(2, 2)) is None
        True
    """
    size = getattr(model, "tp_size", None) or 1
    if size <= 1 or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return None
    mesh = getattr(model, "_device_mesh", None)
    if mesh is None or "tp" not in (mesh.mesh_dim_names or ()):
        raise MetaSDConfigError(
            f"a target with `tp_size` {size} must carry transformers' device mesh with a 'tp' dimension, but has "
            f"{mesh!r}. Load it with `from_pretrained(..., tp_plan='auto')` under `torchrun`."
        )
    return mesh["tp"].get_group()


def _device(group: Any) -> torch.device:
    """Where a tensor for a collective on `group` must live: the current GPU for NCCL, else the CPU."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree(values: Sequence[float], target: Any = None) -> list[float]:
    """Rank 0's `values` on every rank across which `target` is sharded (default: the target of the call `agreeing`
    runs; outside one, or for a target that is not sharded, `values` as they are, without any communication).

    Every rank must call it at the same point with as many values: it is one broadcast.

    Example:
        >>> agree([0.25, 3.0])   # no call on a sharded target running: nothing to agree with
        [0.25, 3.0]
    """
    group = _GROUP.get() if target is None else tensor_parallel_group(target)
    if group is None:
        return list(values)
    tensor = torch.tensor(list(values), dtype=torch.float64, device=_device(group))
    torch.distributed.broadcast(tensor, group=group, group_src=0)
    return tensor.tolist()


def _agree_on_random_state(generator: random.Random, group: Any) -> None:
    """Set `generator` to rank 0's state on every rank of `group`."""
    state = [generator.getstate()]
    torch.distributed.broadcast_object_list(state, group=group, group_src=0, device=_device(group))
    generator.setstate(state[0])


@contextmanager
def agreeing(model: Any, policy: Any) -> Iterator[None]:
    """Within the block, a call on the sharded `model` makes rank 0's decisions on every rank (module docstring):
    the call's clock and `agree` answer rank 0's values, and `policy`'s random generator (`Policy`'s ``_rng``)
    starts from rank 0's state. Does nothing when `model` is not sharded (`tensor_parallel_group` is ``None``)."""
    group = tensor_parallel_group(model)
    if group is None:
        yield
        return
    generator = getattr(policy, "_rng", None)
    if isinstance(generator, random.Random):
        _agree_on_random_state(generator, group)
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)
