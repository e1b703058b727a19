"""A float32 prefill for low-precision model drafters on CPU, used only where it measures faster.

A model drafter stored in bfloat16 (or float16) runs two kinds of forward pass: one-token drafting steps, bound by
memory traffic, where the narrow dtype is cheaper, and multi-token catch-ups (the prompt's prefill, the tokens other
drafters added), bound by arithmetic. On a CPU without native bfloat16 arithmetic the second kind costs several
times its float32 cost: on this project's 2-core machine (`python recipes/benchmarks/bench_drafter_dtype.py`), the embedded
pool's 2-layer drafter took 865 ms in bfloat16 against 123 ms in float32 for a 600-token prefill, and 4.2 against
5.2 ms for one step. On a CPU with bfloat16 instructions the answer can be the other way round, so nothing here is a
constant: `choose_prefill_dtype` times the drafter's body on two chunk lengths in both dtypes, once per process for
a given (model shapes, dtype, thread count), and keeps float32 for the catch-up lengths where it is faster.

Where it is, those catch-ups (all from the measured crossover length on) run through a float32 copy of the
drafter's decoder body (its layers and final norm; the embedding lookup and the LM head stay the drafter's own),
and the drafter's KV cache is cast to float32 for that pass and back after it. The drafts change only by rounding:
verification is what decides the output, so decoding stays lossless either way.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .._distributed import agree

__all__ = [
    "MEASURED_LENGTHS",
    "SHORTEST_CATCH_UP",
    "PrefillChoice",
    "cast_cache",
    "choose_prefill_dtype",
    "clear_prefill_choices",
    "crossover",
    "float32_body",
    "float32_prefill_applies",
]

#: The two chunk lengths `choose_prefill_dtype` times (a short and a longer catch-up).
MEASURED_LENGTHS = (4, 20)
#: No catch-up shorter than this takes the float32 body (one token is a drafting step's shape).
SHORTEST_CATCH_UP = 2


@dataclass(frozen=True)
class PrefillChoice:
    r"""Which catch-ups of a model drafter run in float32, and what the measurement found.

    Each variant's cost of a catch-up of :math:`T` tokens is modelled as :math:`a + bT`, fitted through its times at
    the two `MEASURED_LENGTHS`; float32 takes the catch-ups where it costs less than ``(1 - margin)`` times the
    stored dtype, which for two lines is every :math:`T \ge` `min_tokens`.

    Attributes:
        min_tokens: shortest catch-up that takes the float32 body, or ``None``: none does.
        stored: ``(a, b)`` in seconds and seconds per token for the drafter's own dtype (``nan`` if unmeasured).
        float32: the same for the float32 body.
        measured: whether the choice came from a measurement (``False``: forced by the user).
        seconds: wall time the measurement took (0 when cached).

    Example:
        >>> PrefillChoice(8).takes_float32(20), PrefillChoice(8).takes_float32(3), PrefillChoice(None).takes_float32(99)
        (True, False, False)
    """

    min_tokens: int | None
    stored: tuple[float, float] = (float("nan"), float("nan"))
    float32: tuple[float, float] = (float("nan"), float("nan"))
    measured: bool = False
    seconds: float = 0.0

    def takes_float32(self, num_tokens: int) -> bool:
        """Whether a catch-up of `num_tokens` tokens runs through the float32 body."""
        return self.min_tokens is not None and num_tokens >= self.min_tokens


def crossover(stored: tuple[float, float], float32: tuple[float, float], margin: float) -> int | None:
    r"""Smallest :math:`T \ge` `SHORTEST_CATCH_UP` with :math:`a_f + b_f T < (1 - m)(a_s + b_s T)`, or ``None``.

    Example:
        >>> crossover((0.001, 0.0015), (0.004, 0.0002), 0.1)   # float32: dearer to start, far cheaper per token
        3
        >>> crossover((0.001, 0.0002), (0.001, 0.0003), 0.1) is None
        True
    """
    (a_s, b_s), (a_f, b_f) = stored, float32
    slope = b_f - (1.0 - margin) * b_s  # the float32 line's advantage per token, negative where it gains
    offset = (1.0 - margin) * a_s - a_f
    if offset > 0 and slope <= 0:
        return SHORTEST_CATCH_UP  # cheaper from the start and not losing ground
    if slope >= 0:
        return None  # never gains per token: no length where it wins (or it only wins on ever shorter chunks)
    return max(SHORTEST_CATCH_UP, math.floor(offset / slope) + 1)


#: (architecture, parameter shapes, dtype, threads, margin) -> the choice: kept per architecture, not per drafter (no
#: object's id in the key), so a new drafter of a measured architecture reuses it and the map grows only with new ones.
_CHOICES: dict[tuple[Any, ...], PrefillChoice] = {}
_CHOICES_LOCK = threading.Lock()


def clear_prefill_choices() -> None:
    """Forget the cached prefill decisions of this process (the next catch-up measures again)."""
    with _CHOICES_LOCK:
        _CHOICES.clear()


def float32_prefill_applies(model: torch.nn.Module) -> bool:
    """Whether a float32 body can stand in for `model`'s own in a catch-up.

    It can for a causal LM on CPU whose weights are bfloat16 or float16, that exposes ``base_model`` and input and
    output embeddings, whose logits are the LM head's product alone (no soft-capping or logit scale) and whose cache
    is made of plain `DynamicLayer`s (no sliding window).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> model = LlamaForCausalLM(cfg)
        >>> float32_prefill_applies(model), float32_prefill_applies(model.bfloat16())
        (False, True)
    """
    config = getattr(model, "config", None)
    if config is None or getattr(model, "base_model", model) is model:
        return False
    try:
        parameter = next(model.parameters())
        embeddings, head = model.get_input_embeddings(), model.get_output_embeddings()
    except (StopIteration, AttributeError, NotImplementedError):
        return False
    if parameter.device.type != "cpu" or parameter.dtype not in (torch.bfloat16, torch.float16):
        return False
    if embeddings is None or head is None:
        return False
    if any(getattr(config, name, None) is not None for name in ("final_logit_softcapping", "logit_scale")):
        return False
    return all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers)


def float32_body(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of ``model.base_model`` without its embedding (fed ``inputs_embeds``), in eval mode.

    The embedding is left out of the copy (a vocabulary-sized table); `model` is given it back before this returns.
    """
    base = model.base_model
    embeddings = base.get_input_embeddings()
    base.set_input_embeddings(torch.nn.Identity())
    try:
        body = copy.deepcopy(base)
    finally:
        base.set_input_embeddings(embeddings)
    return body.float().eval()


def cast_cache(cache: DynamicCache, dtype: torch.dtype) -> None:
    """Cast the keys and values of every filled layer of `cache` to `dtype`, in place of the old tensors."""
    for layer in cache.layers:
        if getattr(layer, "is_initialized", False) and layer.keys.dtype != dtype:
            layer.keys = layer.keys.to(dtype)
            layer.values = layer.values.to(dtype)


@torch.no_grad()
def choose_prefill_dtype(
    model: torch.nn.Module,
    body: torch.nn.Module,
    *,
    repeats: int = 2,
    margin: float = 0.1,
    timer: Callable[[], float] = time.perf_counter,
) -> PrefillChoice:
    r"""Time catch-ups of `model`'s body in its own dtype and as the float32 `body`; keep float32 where it is faster.

    After one untimed run of each variant on the shorter length, each variant runs `repeats` times, interleaved, on
    random token ids of each of the `MEASURED_LENGTHS` with a fresh cache; a variant's time at a length is its
    fastest run, and the line through its two times gives its cost :math:`a + bT` (`PrefillChoice`). The decision is
    cached per process for a given (parameter shapes, dtype, thread count).

    Args:
        model: the drafter's causal LM (bfloat16 or float16, on CPU).
        body: its float32 body, from `float32_body`.
        repeats: timed runs per variant and length.
        margin: relative advantage float32 needs.
        timer: the clock of the timed runs (injectable for tests).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> model = LlamaForCausalLM(cfg).bfloat16()
        >>> choice = choose_prefill_dtype(model, float32_body(model))
        >>> choice.measured, choice.min_tokens is None or choice.min_tokens >= 2
        (True, True)
    """
    dtype = next(model.parameters()).dtype
    shapes = tuple(tuple(p.shape) for p in model.base_model.parameters())
    key = (type(model).__name__, shapes, dtype, torch.get_num_threads(), margin)
    with _CHOICES_LOCK:
        cached = _CHOICES.get(key)
    if cached is not None:
        return PrefillChoice(cached.min_tokens, cached.stored, cached.float32, cached.measured, 0.0)
    started = time.perf_counter()
    generator = torch.Generator().manual_seed(0)
    embeddings = model.get_input_embeddings()
    short, long = MEASURED_LENGTHS
    embeds = embeddings(torch.randint(0, embeddings.weight.shape[0], (1, long), generator=generator))

    def stored(length: int) -> None:
        model.base_model(inputs_embeds=embeds[:, :length], cache=DynamicCache(config=model.config), use_cache=True)

    def float32(length: int) -> None:
        body(inputs_embeds=embeds[:, :length].float(), cache=DynamicCache(config=model.config), use_cache=True)

    stored(short), float32(short)  # warm-up
    best: dict[tuple[str, int], float] = {}
    for _ in range(repeats):
        for length in MEASURED_LENGTHS:
            for name, fn in (("stored", stored), ("float32", float32)):
                start = timer()
                fn(length)
                elapsed = timer() - start
                best[name, length] = min(best.get((name, length), math.inf), elapsed)
    keys = sorted(best)  # under tensor parallelism, every rank takes rank 0's times (`hf_metasd._distributed`)
    best = dict(zip(keys, agree([best[key] for key in keys])))
    lines = {}
    for name in ("stored", "float32"):
        slope = (best[name, long] - best[name, short]) / (long - short)
        lines[name] = (best[name, short] - slope * short, slope)
    choice = PrefillChoice(
        crossover(lines["stored"], lines["float32"], margin),
        lines["stored"],
        lines["float32"],
        True,
        time.perf_counter() - started,
    )
    with _CHOICES_LOCK:
        _CHOICES[key] = choice
    return choice
