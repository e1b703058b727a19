"""Skinny matrix products for the verification pass on CPU.

A verification pass feeds the target the last token plus the N drafted ones, so every linear layer multiplies a
``(rows, in_features)`` activation, rows = N + 1, by its ``(out_features, in_features)`` weight. On x86 CPUs, the
float32 GEMM that ``torch.nn.functional.linear`` dispatches to (MKL) handles 2 to 8 rows far worse than one row: on
the 2-core machine of the benchmark (`python recipes/benchmarks/bench_verify_cost.py`, SmolLM2-135M after a 64-token prompt), a
4-token pass took 63.2 ms against 41.0 ms for one token. The same product computed the other way round,

$$Y = X W^\\top = (W X^\\top)^\\top,$$

puts the few rows on the GEMM's other side, a shape MKL handles much better here: the 4-token pass then took 37.9 ms,
and 2 to 5 tokens cost 0.87-1.07 one-token steps (the recipe prints both columns on your machine).

The product's result is copied to a contiguous ``(rows, out_features)`` tensor (a few kilobytes). Left as the
transposed view, its last dimension has stride ``rows``, and every op after it pays: the query, key and value then
reach `torch.nn.functional.scaled_dot_product_attention` with a strided last dimension, which sends it from the
flash kernel to the math fallback (`python recipes/benchmarks/bench_verify_cost.py` shows the pass cost on your machine).

The result is the same product in float32 with another summation order (differences of a few ulp, as between any
two GEMM kernels). `skinny_linear` applies it, for the duration of one call, to the `torch.nn.Linear` layers of a
model whose weights are float32 on CPU, only when 2 to `max_rows` rows go through; every other call (one-token
steps, the prompt's prefill, bfloat16, GPU) runs the layer's own forward.

**Which kernel is faster depends on the machine**, not only on its kind: on another 2-core machine of the same kind
the transposed product was *slower* (target forward for 2-5 tokens: 99-104 ms against 63-76 ms stock). So nothing
here is a constant. `choose_verification_kernel` times both products on the target's own layer shapes and the
call's verification row count, once per process for a given (layer shapes, dtype, thread count, rows), keeps the
faster and caches the decision.

**That first choice is then checked on whole verification passes** (`PassKernels`). Timing single layers for a few
milliseconds is cheap but fragile: a burst of load from another process during those milliseconds flips it for the
whole process (seen here: a dev run at 0.94x plain where the same code ran 1.49x in the next process), and a layer's
time can miss what the whole pass gains (attention, copies). So every verification pass of ``k`` tokens is timed,
per kernel and per ``k``, in a per-process cache: the first pass of each ``k`` runs the first choice, the next one
the other kernel, and from then on the kernel with the lower smoothed cost runs, except for re-checks of the other
on a doubling schedule (when the leader has ``4 * 2**c`` passes at ``k``, ``c`` the other's), so that a transient
that misled one comparison is corrected at a cost of :math:`O(\\log n)` passes. `hf_metasd.generate` applies this
(``meta_skinny_gemm=None``, the default), or the user forces a kernel (``True`` / ``False``). The call's telemetry
says which kernel each pass ran (`MetaSDStats.kernels`) and what the passes cost (`MetaSDStats.kernel_pass_costs`).

**One-token passes** (the no-draft arm's plain steps, rounds where every drafter abstained) get the same treatment
with one more candidate: the one-row product computed as the transposed product of the row repeated twice,

$$y = \\big(W\\,[x;\\,x]^\\top\\big)^\\top_{0},$$

because on some CPUs a one-column matrix-vector product is the slow case: on a 2-core AMD EPYC with AVX-512, the
SmolLM2-135M output layer (49152 x 576) took 11.2 ms for one row and 4.8 ms for two rows the transposed way (median
of 100, `torch.mm`), and a whole two-token pass was cheaper than a one-token one (`python
recipes/benchmarks/bench_verify_cost.py`). A one-token pass starts on the stock kernel (what plain `generate` runs), tries the
repeated row once, then keeps the cheaper by the same rule; on machines where it does not pay it is tried
:math:`O(\\log n)` times per process.
"""

from __future__ import annotations

import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from ._distributed import agree
from ._validation import check_int
from .costs import target_cache

__all__ = [
    "DEFAULT_MAX_ROWS",
    "KernelChoice",
    "KernelSwitch",
    "PassKernels",
    "VerificationKernels",
    "choose_verification_kernel",
    "clear_kernel_choices",
    "skinny_linear",
    "skinny_linear_applies",
]

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


def _transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a ``(rows, in_features)`` `x`, computed as ``(weight @ x.T).T``, contiguous."""
    out = torch.mm(weight, x.t()).t().contiguous()
    return out if bias is None else out + bias


class KernelSwitch:
    """Which product the layers patched by `skinny_linear` compute, settable between passes.

    Attributes:
        skinny: ``True``: the transposed product (for 2 to `max_rows` rows); ``False``: the layers' own forward.
        one_row: ``True``: a one-row product is computed as the transposed product of the row repeated twice (its
            first row kept); ``False`` (the default): one row runs the layer's own forward.

    Example:
        >>> layer, switch = torch.nn.Linear(16, 64), KernelSwitch(skinny=False)
        >>> with skinny_linear(layer, switch=switch):
        ...     y = layer(torch.randn(3, 16))     # the stock product: the switch is off
        ...     switch.skinny = True
        ...     z = layer(torch.randn(3, 16))     # the transposed one
        >>> y.shape, z.shape
        (torch.Size([3, 64]), torch.Size([3, 64]))
    """

    def __init__(self, skinny: bool = True, one_row: bool = False) -> None:
        self.skinny = bool(skinny)
        self.one_row = bool(one_row)

    def __repr__(self) -> str:
        return f"KernelSwitch(skinny={self.skinny}, one_row={self.one_row})"


def _skinny_forward(module: torch.nn.Linear, max_rows: int, switch: KernelSwitch | None) -> Any:
    original = module.forward  # the class's bound forward

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1] if x.dim() >= 2 and x.shape[-1] else 0
        one_row = rows == 1 and switch is not None and switch.one_row
        several = 2 <= rows <= max_rows and (switch is None or switch.skinny)
        if x.dtype != torch.float32 or not (one_row or several):
            return original(x)
        flat = x.reshape(rows, x.shape[-1])
        if one_row:  # the row twice: a GEMM instead of a GEMV
            flat = flat.repeat(2, 1)
        out = _transposed_linear(flat, module.weight, module.bias)[:rows]
        return out.reshape(*x.shape[:-1], module.weight.shape[0])

    return forward


@contextmanager
def skinny_linear(
    model: torch.nn.Module, *, max_rows: int = DEFAULT_MAX_ROWS, switch: KernelSwitch | None = None
) -> Iterator[int]:
    """Compute the float32 CPU `nn.Linear` layers of `model` as ``(W @ x.T).T`` for 2 to `max_rows` input rows.

    Yields the number of layers changed; on exit every layer has its own forward back (also after an exception).

    Args:
        model: any module; layers that are not float32 `nn.Linear` on CPU, or whose forward is already replaced,
            are left alone.
        max_rows: largest number of rows (tokens x batch) that takes the transposed product.
        switch: a `KernelSwitch` read on every call of a patched layer (``None``: always the transposed product).

    Example:
        >>> layer = torch.nn.Linear(16, 64)
        >>> x = torch.randn(1, 5, 16)
        >>> with skinny_linear(layer) as changed:
        ...     y = layer(x)
        >>> changed, y.shape, torch.allclose(y, layer(x), atol=1e-5)
        (1, torch.Size([1, 5, 64]), True)
    """
    check_int("max_rows", max_rows, low=2, hint="Pass e.g. 8.")
    changed = [module for module in model.modules() if _eligible(module)]
    for module in changed:
        module.forward = _skinny_forward(module, max_rows, switch)
    try:
        yield len(changed)
    finally:
        for module in changed:
            module.__dict__.pop("forward", None)


# ---------------------------------------------------------------------- choosing by measurement
@dataclass(frozen=True)
class KernelChoice:
    """The verification kernel chosen for a target, and what the measurement found.

    Attributes:
        kernel: ``"skinny"`` (`skinny_linear`) or ``"stock"`` (the layers' own forward).
        stock_seconds: summed median seconds of the stock product over the target's layers (``nan`` if unmeasured).
        skinny_seconds: the same for the transposed product.
        measured: whether the choice came from a measurement (``False``: nothing eligible, or forced by the user).
        seconds: wall time the measurement took in this call (0 when cached).
    """

    kernel: str
    stock_seconds: float = float("nan")
    skinny_seconds: float = float("nan")
    measured: bool = False
    seconds: float = 0.0


_CHOICES: dict[tuple[Any, ...], KernelChoice] = {}
_CHOICES_LOCK = threading.Lock()


def clear_kernel_choices() -> None:
    """Forget the cached kernel decisions of this process (the next call measures again)."""
    with _CHOICES_LOCK:
        _CHOICES.clear()


def _layer_groups(model: torch.nn.Module) -> dict[tuple[int, int, bool], tuple[torch.nn.Linear, int]]:
    """Eligible layers grouped by (out_features, in_features, has bias): one representative and the count."""
    groups: dict[tuple[int, int, bool], tuple[torch.nn.Linear, int]] = {}
    for module in model.modules():
        if _eligible(module):
            key = (module.out_features, module.in_features, module.bias is not None)
            first, count = groups.get(key, (module, 0))
            groups[key] = (first, count + 1)
    return groups


@torch.no_grad()
def choose_verification_kernel(
    model: torch.nn.Module,
    rows: Sequence[int],
    *,
    repeats: int = 3,
    margin: float = 0.03,
    slice_features: int = 4096,
    timer: Callable[[], float] = time.perf_counter,
) -> KernelChoice:
    r"""Time the stock and the transposed product on `model`'s layers and keep the faster (cached per process).

    For every group of eligible layers with the same shape (one representative each) and every row count in
    `rows`, both products run `repeats` times, interleaved, on random ``(rows, in_features)`` inputs after one
    untimed warm-up each; the cost of a kernel is :math:`\sum_{g} n_g \sum_{r} \mathrm{median}_k\, t_{g,r,k}`
    with :math:`n_g` the layers in group :math:`g`. The transposed product wins only if it costs less than
    ``(1 - margin)`` times the stock one (the margin keeps measurement noise from flipping an even choice to the
    non-default kernel). Only float32 CPU layers are eligible: otherwise the answer is ``"stock"`` without a
    measurement.

    Args:
        model: the target.
        rows: the verification row counts of the call (e.g. ``[N + 1]``), each in ``[2, DEFAULT_MAX_ROWS]``.
        repeats: timed runs per product, layer group and row count.
        margin: relative advantage the transposed product needs.
        slice_features: a layer with more output features is timed on that many of its rows, scaled up.
        timer: the clock of the timed products (injectable for tests).

    Example:
        >>> layer = torch.nn.Linear(8, 8).bfloat16()
        >>> choose_verification_kernel(layer, [4]).kernel     # nothing float32 on CPU: nothing to measure
        'stock'
    """
    check_int("repeats", repeats, low=1, hint="Use e.g. 3.")
    rows = sorted({check_int("rows", r, low=2, hint=f"Use row counts in [2, {DEFAULT_MAX_ROWS}].") for r in rows})
    if not rows or rows[-1] > DEFAULT_MAX_ROWS:
        raise ValueError(f"`rows` must hold row counts in [2, {DEFAULT_MAX_ROWS}], but is {rows!r}. Pass e.g. [4].")
    groups = _layer_groups(model)
    if not groups:
        return KernelChoice("stock")
    key = (tuple(sorted((k, n) for k, (_, n) in groups.items())), torch.get_num_threads(), tuple(rows))
    with _CHOICES_LOCK:
        cached = _CHOICES.get(key)
    if cached is not None:
        return KernelChoice(cached.kernel, cached.stock_seconds, cached.skinny_seconds, cached.measured, 0.0)
    started = time.perf_counter()  # the measurement's own cost, for telemetry (real time, not `timer`)
    totals = {"stock": 0.0, "skinny": 0.0}
    generator = torch.Generator().manual_seed(0)
    for layer, count in groups.values():
        # a layer with many output features (the LM head) is timed on its first `slice_features` rows and scaled:
        # both products are linear in the output features, and this keeps the measurement at tens of milliseconds
        rows_kept = min(layer.out_features, slice_features)
        scale = layer.out_features / rows_kept
        weight = layer.weight[:rows_kept]
        bias = None if layer.bias is None else layer.bias[:rows_kept]

        def stock(x: torch.Tensor, weight: torch.Tensor = weight, bias: Any = bias) -> torch.Tensor:
            return torch.nn.functional.linear(x, weight, bias)

        def skinny(x: torch.Tensor, weight: torch.Tensor = weight, bias: Any = bias) -> torch.Tensor:
            return _transposed_linear(x, weight, bias)

        for r in rows:
            x = torch.randn(r, weight.shape[1], generator=generator)
            stock(x), skinny(x)  # warm-up
            samples: dict[str, list[float]] = {"stock": [], "skinny": []}
            for _ in range(repeats):
                for name, fn in (("stock", stock), ("skinny", skinny)):
                    start = timer()
                    fn(x)
                    samples[name].append(timer() - start)
            for name in totals:
                totals[name] += count * scale * statistics.median(samples[name])
    totals["stock"], totals["skinny"] = agree([totals["stock"], totals["skinny"]], model)  # tensor parallel: rank 0's
    kernel = "skinny" if totals["skinny"] < (1.0 - margin) * totals["stock"] else "stock"
    choice = KernelChoice(kernel, totals["stock"], totals["skinny"], True, time.perf_counter() - started)
    with _CHOICES_LOCK:
        _CHOICES[key] = choice
    return choice


# ---------------------------------------------------------------------- checking the choice on whole passes
#: target -> {(threads, k): {kernel: (smoothed seconds, passes)}}: verification passes timed in this process.
_PASS_COSTS: weakref.WeakKeyDictionary[Any, dict[tuple[int, int], dict[str, tuple[float, int]]]] = (
    weakref.WeakKeyDictionary()
)
_KERNELS = ("skinny", "stock")


class PassKernels:
    r"""The verification kernel of each pass, from whole passes timed in this process (see the module docstring).

    Per pass length :math:`k` (tokens fed to the target, 1 to `max_rows`) and kernel, the smoothed seconds
    :math:`\hat t_{k,\kappa}` and the count :math:`n_{k,\kappa}` of the passes timed so far. `choose` returns the
    first choice while :math:`k` has no pass, then the other kernel once, then the leader
    :math:`\arg\min_\kappa \hat t_{k,\kappa}`, except that the other one runs again whenever
    :math:`n_{k,\text{leader}} \ge 4 \cdot 2^{n_{k,\text{other}}}` (re-checks at doubling intervals). For
    :math:`k = 1` the first choice is always ``"stock"`` (what plain `generate` runs) and ``"skinny"`` means the row
    repeated twice (`KernelSwitch.one_row`). A pass of more than `max_rows` tokens never reaches the transposed
    product: its kernel is ``None``.

    Args:
        target: the model whose per-process cache to read and update (``None``: this object's own).
        first_choice: ``"skinny"`` or ``"stock"``, the kernel a length of 2 or more starts with (the layer-level
            measurement).
        max_rows: the largest pass the transposed product applies to.
        smoothing: :math:`\lambda \in (0, 1]` of the smoothed seconds.

    Example:
        >>> kernels = PassKernels(None, "skinny")
        >>> kernels.choose(1), kernels.choose(4), kernels.choose(9)   # one token starts on the stock kernel
        ('stock', 'skinny', None)
        >>> kernels.observe(4, "skinny", 0.20); kernels.choose(4)   # then the other kernel, once
        'stock'
        >>> kernels.observe(4, "stock", 0.10); kernels.choose(4), kernels.best(4)
        ('stock', 'stock')
    """

    def __init__(
        self, target: Any, first_choice: str, *, max_rows: int = DEFAULT_MAX_ROWS, smoothing: float = 0.3
    ) -> None:
        if first_choice not in _KERNELS:
            raise ValueError(
                f"`first_choice` must be one of {list(_KERNELS)}, but is {first_choice!r}. Pass a `KernelChoice.kernel`."
            )
        self.first_choice = first_choice
        self.max_rows = check_int("max_rows", max_rows, low=2, hint="Pass e.g. 8.")
        self.smoothing = float(smoothing)
        self._threads = torch.get_num_threads()
        cache = target_cache(_PASS_COSTS, target)
        self._costs = cache if cache is not None else {}

    def _at(self, num_tokens: int) -> dict[str, tuple[float, int]]:
        return self._costs.setdefault((self._threads, num_tokens), {})

    def _first(self, num_tokens: int) -> str:
        return "stock" if num_tokens == 1 else self.first_choice

    def best(self, num_tokens: int) -> str | None:
        """The leader at `num_tokens` (the first choice until both kernels were timed there); ``None`` where the
        transposed product does not apply."""
        if not 1 <= num_tokens <= self.max_rows:
            return None
        costs, first = self._at(num_tokens), self._first(num_tokens)
        if len(costs) < 2:
            return first
        return min(_KERNELS, key=lambda kernel: (costs[kernel][0], kernel != first))

    def choose(self, num_tokens: int) -> str | None:
        """The kernel of the next pass over `num_tokens` tokens (see the class docstring)."""
        if not 1 <= num_tokens <= self.max_rows:
            return None
        costs, first = self._at(num_tokens), self._first(num_tokens)
        other = "stock" if first == "skinny" else "skinny"
        if first not in costs:
            return first
        if other not in costs:
            return other
        leader = self.best(num_tokens)
        trailer = other if leader == first else first
        if costs[leader][1] >= 4 * 2 ** costs[trailer][1]:
            return trailer
        return leader

    def observe(self, num_tokens: int, kernel: str | None, seconds: float) -> None:
        """Fold one timed pass over `num_tokens` tokens under `kernel` into its estimate (``None``: nothing)."""
        if kernel is None or not 1 <= num_tokens <= self.max_rows:
            return
        costs = self._at(num_tokens)
        old = costs.get(kernel)
        lam = self.smoothing
        costs[kernel] = (seconds, 1) if old is None else ((1 - lam) * old[0] + lam * seconds, old[1] + 1)

    def summary(self) -> dict[int, dict[str, float]]:
        """Smoothed seconds of a pass by its length and kernel, as timed so far in this process (telemetry)."""
        return {
            k: {kernel: value[0] for kernel, value in costs.items()}
            for (threads, k), costs in sorted(self._costs.items())
            if threads == self._threads and costs
        }


# ---------------------------------------------------------------------- one call's kernels
class VerificationKernels:
    """The verification kernel of one `generate` call: chosen once, then per verification pass, and applied.

    `hf_metasd.generate` builds it (`for_call`) and runs the decoding loop inside `applied`; the candidate generator
    calls `before_pass` once the round's candidates are known (it switches the kernel of the pass about to run) and
    `after_pass` with what the pass cost. With a forced kernel (``meta_skinny_gemm=True`` / ``False``), or nothing
    eligible on the target, the first choice holds for every pass and both hooks do nothing.

    Example:
        >>> layer = torch.nn.Linear(16, 64)
        >>> kernels = VerificationKernels(layer, KernelChoice("skinny", measured=True))
        >>> with kernels.applied():
        ...     kernels.before_pass(4), kernels.before_pass(1)   # a one-token pass starts on the stock kernel
        ('skinny', 'stock')
        >>> VerificationKernels(layer, KernelChoice("stock")).before_pass(4) is None   # forced: not per pass
        True
    """

    def __init__(self, model: torch.nn.Module, choice: KernelChoice) -> None:
        self.model = model
        self.choice = choice
        # checked on the call's own passes only when the first choice was measured (not forced by the user)
        self.per_pass = PassKernels(model, choice.kernel) if choice.measured else None
        self.switch = KernelSwitch(choice.kernel == "skinny") if choice.measured else None

    @classmethod
    def for_call(cls, model: torch.nn.Module, skinny: bool | None, num_assistant_tokens: int) -> VerificationKernels:
        """The kernels of a call: forced by `skinny` (``meta_skinny_gemm``), else measured once per process.

        The layers are timed at the call's longest pass, ``num_assistant_tokens + 1`` rows, or at `DEFAULT_MAX_ROWS`
        when that is longer: a draft length is a cap and most passes are shorter, and passes beyond
        `DEFAULT_MAX_ROWS` run the stock product whatever the choice. (Answering "stock" for a cap above it, as
        before, put every pass of such a call on the stock kernel: with ``num_assistant_tokens=12`` the embedded pool
        ran at 1.18x plain on dev prompts against 2.00x with 3, `recipes/benchmarks/untrained_pool_probe.py`.)
        """
        if skinny is not None:
            return cls(model, KernelChoice("skinny" if skinny else "stock"))
        return cls(model, choose_verification_kernel(model, [min(num_assistant_tokens + 1, DEFAULT_MAX_ROWS)]))

    def applied(self) -> AbstractContextManager[Any]:
        """The `skinny_linear` patch over the call (switched per pass when chosen per pass), or nothing."""
        if self.switch is not None:
            return skinny_linear(self.model, switch=self.switch)
        return skinny_linear(self.model) if self.choice.kernel == "skinny" else nullcontext()

    def before_pass(self, num_tokens: int) -> str | None:
        """Switch to the kernel of the next verification pass over `num_tokens` tokens and return it (``None``: not
        chosen per pass, or a pass the transposed product does not apply to)."""
        if self.per_pass is None:
            return None
        kernel = self.per_pass.choose(num_tokens)
        if kernel is not None:
            if num_tokens == 1:  # a plain step: "skinny" is the row repeated twice; the drafters' steps never are
                self.switch.one_row = kernel == "skinny"
            else:
                self.switch.skinny = kernel == "skinny"
        return kernel

    def after_pass(self, num_tokens: int, kernel: str | None, seconds: float | None) -> bool:
        """Fold a verification pass that ran `kernel` and took `seconds` (``None``: not timed) into the per-pass
        costs; returns whether it ran the kernel that verifies `num_tokens` tokens fastest so far (its time then
        measures verification at that length; a re-check of the other kernel does not)."""
        if self.switch is not None:
            self.switch.one_row = False  # only for the verification pass it was set for: drafters never
        if self.per_pass is None or kernel is None:
            return True
        fastest = kernel == self.per_pass.best(num_tokens)
        if seconds is not None:
            self.per_pass.observe(num_tokens, kernel, seconds)
        return fastest

    def summary(self, kernels: list[str | None]) -> tuple[str, dict[str, float], dict[int, dict[str, float]]]:
        """``(kernel, timings, pass_costs)`` of the call for its telemetry: the kernel most of its passes ran (the
        first choice when none was chosen per pass; `kernels` are the per-round ones), what the layer measurement
        found, and the smoothed seconds of a pass by length and kernel in this process.
        """
        chosen = [kernel for kernel in kernels if kernel is not None]
        kernel = max(_KERNELS, key=chosen.count) if chosen else self.choice.kernel
        timings = (
            {"stock_seconds": self.choice.stock_seconds, "skinny_seconds": self.choice.skinny_seconds}
            if self.choice.measured
            else {}
        )
        return kernel, timings, ({} if self.per_pass is None else self.per_pass.summary())
