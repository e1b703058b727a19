"""``--dtype auto`` for the demo and the bench: bfloat16 where this machine computes it with matrix units and a plain
decoding step in bfloat16 measures no slower than in float32; float32 otherwise.

Whether bfloat16 pays is the machine's, not the model's: on one 2-core Xeon with AMX a plain step of SmolLM2-135M
cost the same in both dtypes and an 8-token verification pass 1.2 plain steps in bfloat16 against 1.8 in float32; on
a 2-core AMD EPYC with AVX512-BF16 (no AMX) a plain step cost 53-67 ms in bfloat16 against 65-79 ms in float32 and a
9-token pass 1.3-1.4 plain steps; a CPU without bfloat16 instructions emulates it and runs it slower. So the choice
is measured where it runs:

1. **bfloat16 matrix units**: a CUDA device that supports bfloat16, or a CPU with AMX-BF16 tiles or AVX512-BF16
   (`bfloat16_units`). Without them: float32, nothing measured.
2. **a plain step in each dtype**: the target, loaded once in float32, decodes one token on a cached 32-token context,
   `repeats` times in each dtype, interleaved; the median of each. bfloat16 is chosen when its median is at most
   ``1 + NOISE`` times float32's (`NOISE`: two medians of the same dtype differ by up to that much here).

The choice and its measurement are printed. A user's own model keeps the dtype the user loaded it in: nothing in
`hf_metasd.generate` changes a dtype.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DTYPES", "NOISE", "DtypeChoice", "bfloat16_units", "choose_dtype", "plain_step_seconds"]

#: The values of the demo's and the bench's ``--dtype``.
DTYPES = ("auto", "float32", "bfloat16")

#: How much slower a bfloat16 step may measure and still be taken as not slower: the spread between two medians of
#: the same dtype's steps on this project's 2-core machines.
NOISE = 0.05


@dataclass(frozen=True)
class DtypeChoice:
    """What ``--dtype auto`` chose and why.

    Attributes:
        dtype: the chosen dtype name (``"bfloat16"`` or ``"float32"``).
        units: the bfloat16 matrix units found (``"cuda"``, ``"amx_bf16"``, ``"avx512_bf16"``), or ``None``.
        float32_ms / bfloat16_ms: median milliseconds of a plain step in each dtype (``None``: not measured).
    """

    dtype: str
    units: str | None
    float32_ms: float | None = None
    bfloat16_ms: float | None = None

    def describe(self) -> str:
        """One line for the user.

        Example:
            >>> DtypeChoice("bfloat16", "avx512_bf16", 36.1, 35.2).describe()
            'dtype auto -> bfloat16 (avx512_bf16; a plain step: bfloat16 35.2 ms, float32 36.1 ms)'
            >>> DtypeChoice("float32", None).describe()
            'dtype auto -> float32 (no bfloat16 matrix units on this machine)'
        """
        if self.units is None:
            return f"dtype auto -> {self.dtype} (no bfloat16 matrix units on this machine)"
        return (
            f"dtype auto -> {self.dtype} ({self.units}; a plain step: bfloat16 {self.bfloat16_ms:.1f} ms, "
            f"float32 {self.float32_ms:.1f} ms)"
        )


def bfloat16_units(device: torch.device | str = "cpu") -> str | None:
    """The bfloat16 matrix units of `device`: ``"cuda"`` (a CUDA device with bfloat16), ``"amx_bf16"`` or
    ``"avx512_bf16"`` (CPU instructions torch reports), else ``None``."""
    device = torch.device(device)
    if device.type == "cuda":
        return "cuda" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else None
    if device.type != "cpu":
        return None
    checks = (("amx_bf16", "_is_amx_tile_supported"), ("avx512_bf16", "_is_avx512_bf16_supported"))
    for name, check in checks:
        probe = getattr(torch.cpu, check, None)
        if probe is not None and probe():
            return name
    return None


@torch.no_grad()
def plain_step_seconds(model: Any, repeats: int = 9, context: int = 32) -> list[float]:
    """Seconds of `repeats` plain decoding steps of `model` (one token on a cached `context`-token context)."""
    device = next(model.parameters()).device
    ids = torch.arange(1, context + 1, device=device)[None] % model.config.vocab_size
    out = model(ids, use_cache=True)
    step = ids[:, -1:]
    seconds = []
    for _ in range(repeats):
        cache = copy.deepcopy(out.past_key_values)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        model(step, past_key_values=cache, use_cache=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return seconds


def choose_dtype(model: Any, *, repeats: int = 9) -> tuple[Any, DtypeChoice]:
    """`model` (float32) in the dtype ``--dtype auto`` chooses, and the choice (see the module docstring).

    Returns `model` itself when float32 is chosen, a bfloat16 copy of it otherwise (the float32 model is then
    dropped by the caller).

    Raises:
        ValueError: `model` is not float32.
    """
    dtype = next(model.parameters()).dtype
    if dtype != torch.float32:
        raise ValueError(
            f"`model` must be loaded in float32 for `--dtype auto` to measure both dtypes, but is {dtype}. Load it "
            "in float32, or pass the dtype you want instead of auto."
        )
    units = bfloat16_units(next(model.parameters()).device)
    if units is None:
        return model, DtypeChoice("float32", None)
    low = copy.deepcopy(model).to(torch.bfloat16)
    plain_step_seconds(model, 2)  # first calls set kernels up: not measured
    plain_step_seconds(low, 2)
    float32, bfloat16 = [], []
    for _ in range(repeats):  # interleaved: machine noise hits both alike
        float32 += plain_step_seconds(model, 1)
        bfloat16 += plain_step_seconds(low, 1)
    f32, b16 = 1000 * statistics.median(float32), 1000 * statistics.median(bfloat16)
    if b16 <= (1 + NOISE) * f32:
        return low, DtypeChoice("bfloat16", units, f32, b16)
    return model, DtypeChoice("float32", units, f32, b16)
