"""Skinny matrix products for the verification pass on CPU.

A verification pass feeds the target the last token plus the N drafted ones, so every linear layer multiplies a
``(rows, in_features)`` activation, rows = N + 1, by its ``(out_features, in_features)`` weight. On x86 CPUs, the
float32 GEMM that ``torch.nn.functional.linear`` dispatches to (MKL) handles 2 to 8 rows far worse than one row: on
the 2-core machine of the benchmark (`python recipes/bench_verify_cost.py`, SmolLM2-135M after a 64-token prompt), a
4-token pass took 63.2 ms against 41.0 ms for one token. The same product computed the other way round,

$$Y = X W^\\top = (W X^\\top)^\\top,$$

puts the few rows on the GEMM's other side, a shape MKL handles much better here: the 4-token pass then took 37.9 ms,
and 2 to 5 tokens cost 0.87-1.07 one-token steps (the recipe prints both columns on your machine).

The result is the same product in float32 with another summation order (differences of a few ulp, as between any
two GEMM kernels). `skinny_linear` applies it, for the duration of one call, to the `torch.nn.Linear` layers of a
model whose weights are float32 on CPU, only when 2 to `max_rows` rows go through; every other call (one-token
steps, the prompt's prefill, bfloat16, GPU) runs the layer's own forward. `hf_metasd.generate` uses it for the
target's verification passes unless ``meta_skinny_gemm=False``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["DEFAULT_MAX_ROWS", "skinny_linear", "skinny_linear_applies"]

#: Largest row count routed through the transposed product (measured: it loses from about 12 rows on).
DEFAULT_MAX_ROWS = 8


def _eligible(module: torch.nn.Module) -> bool:
    """A plain `nn.Linear` with a float32 CPU weight and no forward already replaced (e.g. by accelerate hooks)."""
    weight = getattr(module, "weight", None)
    return (
        isinstance(module, torch.nn.Linear)
        and "forward" not in module.__dict__
        and isinstance(weight, torch.Tensor)
        and weight.device.type == "cpu"
        and weight.dtype == torch.float32
    )


def skinny_linear_applies(model: torch.nn.Module) -> bool:
    """Whether `skinny_linear` would change any layer of `model` (some `nn.Linear` has a float32 CPU weight).

    Example:
        >>> skinny_linear_applies(torch.nn.Linear(4, 4)), skinny_linear_applies(torch.nn.Linear(4, 4).bfloat16())
        (True, False)
    """
    return any(_eligible(module) for module in model.modules())


def _skinny_forward(module: torch.nn.Linear, max_rows: int) -> Any:
    original = module.forward  # the class's bound forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
        if not 2 <= rows <= max_rows or x.dtype != torch.float32:
            return original(x)
        flat = x.reshape(rows, x.shape[-1])
        out = torch.mm(module.weight, flat.t()).t()
        if module.bias is not None:
            out = out + module.bias
        return out.reshape(*x.shape[:-1], module.weight.shape[0])

    return forward


@contextmanager
def skinny_linear(model: torch.nn.Module, *, max_rows: int = DEFAULT_MAX_ROWS) -> Iterator[int]:
    """Compute the float32 CPU `nn.Linear` layers of `model` as ``(W @ x.T).T`` for 2 to `max_rows` input rows.

    Yields the number of layers changed; on exit every layer has its own forward back (also after an exception).

    Args:
        model: any module; layers that are not float32 `nn.Linear` on CPU, or whose forward is already replaced,
            are left alone.
        max_rows: largest number of rows (tokens x batch) that takes the transposed product.

    Example:
        >>> layer = torch.nn.Linear(16, 64)
        >>> x = torch.randn(1, 5, 16)
        >>> with skinny_linear(layer) as changed:
        ...     y = layer(x)
        >>> changed, y.shape, torch.allclose(y, layer(x), atol=1e-5)
        (1, torch.Size([1, 5, 64]), True)
    """
    if not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows < 2:
        raise ValueError(f"`max_rows` must be an int >= 2, but is {max_rows!r}. Pass e.g. 8.")
    changed = [module for module in model.modules() if _eligible(module)]
    for module in changed:
        module.forward = _skinny_forward(module, max_rows)
    try:
        yield len(changed)
    finally:
        for module in changed:
            module.__dict__.pop("forward", None)
