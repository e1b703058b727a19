r"""The lossless contract in each dtype, and the check that tells a near-tie from an error.

**Float32.** Greedy MetaSD output is token-for-token what plain `generate` returns; sampling follows the target's
distribution (speculative sampling). Any divergence from plain greedy output is an error.

**bfloat16 / float16.** Every emitted token is the target's own choice *from the pass that verified it*: the argmax
(greedy) of, or an exact speculative-sampling draw (sampling) from, the target's logits as that pass computed them.
A verification pass feeds several tokens at once, and in low precision its arithmetic rounds differently from plain
decoding's one-token steps (other matrix shapes, other kernels, other accumulation orders), so the same position's
logits differ in their last bits. Where two tokens' logits are that close, the two passes may rank them differently
and the outputs part there; transformers' own assisted generation and prompt lookup part from plain greedy output in
the same way. The output may leave plain greedy decoding **only at a near-tie**:

At the first position :math:`i` where a sequence differs from plain greedy output, with :math:`a` plain's token
and :math:`b` the other's, recompute the target's logits over the common prefix twice, in float32
(:math:`z^{32}`) and in the low-precision dtype itself (:math:`z^{lp}`). Let

.. math::

    g = z^{32}_a - z^{32}_b, \qquad
    \epsilon = \max_v \left| z^{lp}_v - z^{32}_v \right|, \qquad
    \text{near-tie} \iff |g| \le \tau = 2 \epsilon .

:math:`\epsilon` is how far rounding in that dtype moves a logit at this very position (the largest deviation over
the vocabulary). A low-precision pass ranks :math:`b` above :math:`a` only if its errors on the two logits close
the float32 gap, :math:`|g| \le |\delta_a| + |\delta_b|`; with each error at most about :math:`\epsilon`, two passes
can rank them differently only when :math:`|g| \le 2 \epsilon`. A wrong token (a drafted token accepted against the
target, say) has a float32 gap of whole logits and is reported as an error. On SmolLM2-135M in bfloat16, over
1,344 positions of dev-split answers, :math:`\epsilon` had a median of 0.37 logits (3.5 units of bfloat16 rounding,
:math:`2^{-8}`, of the largest logit) and a maximum of 1.35, while the 23 divergences seen had gaps of at most 0.31;
see docs/concepts.md, "The lossless contract", for the measurements. In float32, :math:`\tau = 0`: nothing but
identity passes.

The check needs a float32 copy of the target (`float32_copy`). With the call's logits processors
(``logits_processor=``: a repetition penalty, a sequence bias, ...) it judges the scores the tokens were chosen
from: :math:`z` above are then the processed scores (each pass's logits in float32, then the processors, as plain
`generate` applies them), the tolerance their largest deviation over the tokens both leave finite, and the
`Divergence` says so (`processed`). Without them it reads raw logits, which a processor that moves the two tokens'
scores makes the wrong judge.

Example:
    >>> import torch
    >>> first_divergence(torch.tensor([[5, 1, 2, 3]]), torch.tensor([[5, 1, 4, 3]]), prompt_length=1)
    1
    >>> first_divergence(torch.tensor([[5, 1, 2]]), torch.tensor([[5, 1, 2]]), prompt_length=1) is None
    True
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["LOW_PRECISION_DTYPES", "Divergence", "check_divergence", "first_divergence", "float32_copy"]

#: The dtypes whose contract is "plain output, or a near-tie"; every other dtype's is identity.
LOW_PRECISION_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Divergence:
    """Where a sequence first leaves plain greedy output, and whether that is a near-tie.

    Attributes:
        position: index among the new tokens (0: the first generated token).
        plain_token: plain greedy decoding's token there (`a`).
        token: the other sequence's token there (`b`; ``None`` where it had stopped).
        gap: :math:`g = z^{32}_a - z^{32}_b` (``nan`` where `token` is ``None``).
        tolerance: :math:`\\tau = 2\\epsilon` (0 in float32).
        near_tie: ``|gap| <= tolerance`` in a low-precision dtype; always ``False`` in float32.
        dtype: the target's dtype, as a string (``"bfloat16"``).
        processed: whether `gap` and `tolerance` are of the processed scores (the call's logits processors applied),
            rather than of raw logits.
    """

    position: int
    plain_token: int | None
    token: int | None
    gap: float
    tolerance: float
    near_tie: bool
    dtype: str
    processed: bool = False

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of the fields."""
        return asdict(self)

    def describe(self, tokenizer: Any = None) -> str:
        """One line: where, which tokens, and why (a near-tie, or not).

        Example:
            >>> Divergence(17, 1114, 4845, -0.042, 0.535, True, "bfloat16").describe()
            'left plain greedy output at new token 17 (plain 1114, here 4845): a bfloat16 near-tie, float32 logit gap 0.042 <= tolerance 0.535'
        """

        def name(token: int | None) -> str:
            if token is None:
                return "<end>"
            return repr(tokenizer.decode([token])) if tokenizer is not None else str(token)

        where = f"left plain greedy output at new token {self.position} (plain {name(self.plain_token)}, here {name(self.token)})"
        scores = "processed-score" if self.processed else "logit"
        if self.near_tie:
            return f"{where}: a {self.dtype} near-tie, float32 {scores} gap {abs(self.gap):.3f} <= tolerance {self.tolerance:.3f}"
        if self.dtype not in {str(d).removeprefix("torch.") for d in LOW_PRECISION_DTYPES}:
            return f"{where}: an ERROR ({self.dtype} output must be identical to plain greedy output)"
        return f"{where}: NOT a near-tie, an ERROR (float32 {scores} gap {abs(self.gap):.3f} > tolerance {self.tolerance:.3f})"


def first_divergence(reference: torch.Tensor, sequence: torch.Tensor, prompt_length: int) -> int | None:
    """Index among the new tokens of the first position where `sequence` ``(1, L')`` differs from `reference`
    ``(1, L)`` (plain greedy output); ``None`` if they are equal. Where one is a prefix of the other, the shorter
    one's length."""
    n = min(reference.shape[-1], sequence.shape[-1])
    differs = (reference[0, :n] != sequence[0, :n].to(reference.device)).nonzero()
    if len(differs):
        return int(differs[0]) - prompt_length
    if reference.shape[-1] == sequence.shape[-1]:
        return None
    return n - prompt_length


def float32_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A float32 copy of `model` for `check_divergence` (the model itself when it is float32 already)."""
    if next(model.parameters()).dtype == torch.float32:
        return model
    return copy.deepcopy(model).float().eval()


@torch.no_grad()
def _last_scores(model: torch.nn.Module, prefix: torch.Tensor, logits_processor: Any = None) -> torch.Tensor:
    """The next-token logits of `model` after `prefix` ``(1, L)``, in float32, through `logits_processor` if given
    (as plain `generate` processes them), on the CPU."""
    device = next(model.parameters()).device
    prefix = prefix.to(device)
    scores = model(prefix).logits[:, -1].float()
    if logits_processor is not None:
        scores = logits_processor(prefix, scores)
    return scores[0].cpu()


def check_divergence(
    target: torch.nn.Module,
    reference: torch.Tensor,
    sequence: torch.Tensor,
    prompt_length: int,
    *,
    target_float32: torch.nn.Module | None = None,
    logits_processor: Any = None,
) -> Divergence | None:
    """Compare `sequence` with plain greedy output `reference` of `target`; ``None`` where they are equal, else the
    first `Divergence`, classified by the module's definition of a near-tie.

    Args:
        target: the target as it generated (its dtype decides the contract).
        reference: ``(1, L)`` plain greedy output (prompt included).
        sequence: ``(1, L')`` the output to check (prompt included).
        prompt_length: tokens of the prompt at the start of both.
        target_float32: a float32 copy of `target` (`float32_copy`); made here when ``None`` (pass one to check many
            sequences).
        logits_processor: the call's logits processors (a `LogitsProcessorList`, or any ``f(input_ids, scores)``),
            when it had any: the near-tie is then judged on the processed scores (module docstring). ``None``: raw
            logits.
    """
    position = first_divergence(reference, sequence, prompt_length)
    if position is None:
        return None
    dtype = next(target.parameters()).dtype
    index = prompt_length + position
    plain_token = int(reference[0, index]) if index < reference.shape[-1] else None
    token = int(sequence[0, index]) if index < sequence.shape[-1] else None
    name = str(dtype).removeprefix("torch.")
    processed = logits_processor is not None
    if dtype not in LOW_PRECISION_DTYPES or plain_token is None or token is None:
        return Divergence(position, plain_token, token, float("nan"), 0.0, False, name, processed)
    prefix = reference[:, :index]
    float32 = target_float32 if target_float32 is not None else float32_copy(target)
    z32 = _last_scores(float32, prefix, logits_processor)
    low = _last_scores(target, prefix, logits_processor)
    gap = float(z32[plain_token] - z32[token])
    both = torch.isfinite(z32) & torch.isfinite(low)  # a processor's -inf (a banned token) deviates by nothing
    tolerance = 2.0 * float((low - z32)[both].abs().max()) if bool(both.any()) else 0.0
    return Divergence(position, plain_token, token, gap, tolerance, abs(gap) <= tolerance, name, processed)
