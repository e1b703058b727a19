"""The `Drafter` protocol: one arm of the pool.

A round with drafter *d* is::

    d.catch_up(input_ids)                     # ingest the tokens d has not seen (its own KV cache)
    tokens, logits = d.draft(input_ids, N, logits_processor=..., do_sample=...)

`catch_up` and `draft` are separate so that their costs are measured separately: catching up after other drafters
ran is the price of switching.

**Per-call state.** A drafter object in a pool is shared: by every `generate` call, and by concurrent calls in other
threads. A call never drafts with it directly; it calls `spawn()` once, which returns a copy for that call only (same
weights, settings and indexes; its own KV cache and positions), and drafts with the copy. `in_use()` is entered once
per call around the whole decoding loop: it puts the drafter's modules in the mode drafting needs (eval, the arm's
adapter) and restores what the user had when the last concurrent call leaves. `on_generation_end` is called on the
shared drafter with the finished sequence (a corpus drafter that grows online uses it; the default does nothing).
"""

from __future__ import annotations

import copy
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

import torch

from ..errors import DrafterCompatibilityError, InvalidPoolError, MetaSDDrafterError
from .load import LoadContext
from .save import SaveContext
from .spec import DrafterSpec
from .vocab import target_vocab_size

__all__ = ["Drafter", "check_draft", "eval_mode", "int_error", "shared_scope"]

_SCOPES: dict[Hashable, list[Any]] = {}
_SCOPES_LOCK = threading.Lock()


@contextmanager
def shared_scope(key: Hashable, enter: Callable[[], Any], leave: Callable[[Any], None]) -> Iterator[None]:
    """A change of shared state that concurrent calls make together: the first call in runs ``state = enter()``,
    the last one out runs ``leave(state)``; calls in between find the change already made.

    This is how a call puts a user's module in eval mode (or on an adapter) and gives it back as it was, even when
    several threads draft with the same module at once. `key` may hold ``id(module)``: an entry lives only while a
    call is inside the scope, and that call holds the module, so the id cannot be another object's meanwhile.

    Example:
        >>> log = []
        >>> with shared_scope("k", lambda: log.append("in"), lambda _: log.append("out")):
        ...     with shared_scope("k", lambda: log.append("in"), lambda _: log.append("out")):
        ...         pass
        >>> log
        ['in', 'out']
    """
    with _SCOPES_LOCK:
        entry = _SCOPES.get(key)
        if entry is None:
            entry = _SCOPES[key] = [0, enter()]
        entry[0] += 1
    try:
        yield
    finally:
        with _SCOPES_LOCK:
            entry[0] -= 1
            if entry[0] == 0:
                del _SCOPES[key]
                leave(entry[1])


def eval_mode(module: torch.nn.Module) -> AbstractContextManager[None]:
    """`module` in eval mode for the duration (shared by concurrent calls); every submodule's training flag back after.

    Example:
        >>> layer = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)).train()
        >>> with eval_mode(layer):
        ...     layer.training
        False
        >>> layer.training, layer[1].training
        (True, True)
    """

    def enter() -> list[tuple[torch.nn.Module, bool]]:
        flags = [(m, m.training) for m in module.modules()]
        module.eval()
        return flags

    def leave(flags: list[tuple[torch.nn.Module, bool]]) -> None:
        for m, training in flags:
            m.training = training

    return shared_scope(("eval", id(module)), enter, leave)


def int_error(value: Any) -> type[Exception]:
    """The class of the error for an int setting that refuses `value`: `TypeError` when `value` is not an int (a bool
    is not one), else `ValueError` (an int out of range).

    Example:
        >>> int_error("3").__name__, int_error(True).__name__, int_error(0).__name__
        ('TypeError', 'TypeError', 'ValueError')
    """
    return ValueError if isinstance(value, int) and not isinstance(value, bool) else TypeError


class Drafter(ABC):
    """One drafter. Subclasses set `kind` and implement `catch_up`, `draft` and `reset`.

    **Pool round trip.** Each kind owns how it is written to and rebuilt from a pool's `config.json` entry (a
    `~hf_metasd.drafters.spec.DrafterSpec`), so that the pool never names a kind: `spec_group` (which neighbours share
    one entry), `to_spec` (drafters -> entry, scheduling any weight files on the `SaveContext`), `from_spec` (entry ->
    drafters, reading through the `LoadContext`), `validate_spec` (kind-specific checks of an entry, nothing read) and
    `arm_names` (the names of an entry's arms). The defaults fit a model-free drafter whose `config()` is its
    constructor's keyword arguments.

    Attributes:
        name: label used in telemetry, plots and pool configs.
        last_catch_up_tokens: tokens ingested by the last `catch_up` (0 for model-free drafters).
        source: where a pool loaded this drafter from (set by `from_spec`: ``stored``, ``path``, ``revision`` and
            kind-specific keys), ``None`` for a drafter built in memory. Saving the pool again keeps a loaded drafter
            as it came (a reference stays a reference, stored weights stay stored).
    """

    #: Registry key of the drafter kind (`"assistant_model"`, `"prompt_lookup"`, ...).
    kind: ClassVar[str] = ""
    #: Whether `draft` returns logits (``False``: deterministic drafter, BD treats it as one-hot).
    returns_logits: ClassVar[bool] = True
    #: Whether `draft` is a cheap function of `input_ids` alone (no model, no state that a round changes), so that what
    #: it would have drafted at an earlier position can be proposed and scored in hindsight (replayed rounds, see
    #: `hf_metasd.candidate_generator`). Prompt lookup and corpus drafters are; model drafters are not.
    replayable: ClassVar[bool] = False
    #: Whether `draft` leaves the length of the context suffix its proposal continues in ``last_match_length`` and
    #: that suffix's occurrences in ``last_support`` (corpus drafters), so that the round's draft length can follow
    #: the match's class (`hf_metasd.draft_length.match_class`).
    scores_matches: ClassVar[bool] = False

    #: Whether the drafter learns from the target's scores of every verification pass (`observe_scores`; token
    #: recycling): after each round the call hands it the pass's scores, whichever arm drafted the round.
    learns_from_scores: ClassVar[bool] = False

    #: The target layers whose features the drafter reads (white-box drafters: `observe`); ``None`` for one that
    #: reads none. A call records these layers' inputs during its verification passes only when a drafter has some.
    layer_ids: tuple[int, ...] | None = None

    #: Where a pool loaded the drafter from; ``None`` for a drafter built in memory (see the class docstring).
    source: dict[str, Any] | None = None

    #: The target's vocabulary size, set by `spawn` on the call's copy (``None``: not spawned for a target);
    #: `check_draft` checks the drafted ids against it.
    target_vocab: int | None = None

    def __init__(self, name: str | None = None) -> None:
        self.name = name or self.kind
        self.last_catch_up_tokens = 0

    @property
    def vocab_size(self) -> int | None:
        """Logits width, or ``None`` for a drafter that works on any vocabulary (model-free)."""
        return None

    @property
    def device(self) -> torch.device:
        """Where the drafter computes (CPU for model-free drafters)."""
        return torch.device("cpu")

    def check_compatible(self, target: Any) -> None:
        """Raise `DrafterCompatibilityError` if this drafter cannot draft for `target` (called before any compute)."""
        mine, theirs = self.vocab_size, target_vocab_size(target)
        if mine is not None and mine != theirs:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must have the target's vocabulary size {theirs}, but has {mine}. "
                "Use a drafter that shares the target's tokenizer (same vocabulary), or a model-free drafter."
            )

    def spawn(self, target: Any = None) -> Drafter:
        """A copy of this drafter for one `generate` call (for `target`): shared weights and settings, fresh state.

        The default is a shallow copy followed by `reset()`, so `reset` must *assign* new state objects (a new cache,
        a new list), never clear shared ones in place. Override it when a kind needs more (e.g. to keep something
        about `target` on the copy).
        """
        clone = copy.copy(self)
        clone.reset()
        if target is not None:
            clone.target_vocab = target_vocab_size(target)
        return clone

    def in_use(self) -> AbstractContextManager[Any]:
        """Context manager around one whole call (see the module docstring); the default does nothing."""
        return nullcontext()

    def on_generation_end(self, sequence: torch.LongTensor, prompt_length: int) -> None:
        """Called on the shared drafter once a call finished, with its final ``(1, L)`` sequence; default: nothing."""

    def reset(self) -> None:
        """Forget per-sequence state (KV caches) by assigning fresh objects. Called by `spawn`."""

    def catch_up(self, input_ids: torch.LongTensor, *, return_logits: bool | int = False) -> torch.Tensor | None:
        """Ingest the tokens of `input_ids` (shape ``(1, L)``) that this drafter has not seen yet.

        With ``return_logits=True``, return the drafter's raw logits ``(1, m, V)`` at the ``m`` ingested positions
        (full-information feedback); with an int ``k``, at the last ``min(k, m)`` ingested positions (prompt warm
        start); otherwise ``None``.
        """
        self.last_catch_up_tokens = 0
        return None

    def observe(self, features: torch.Tensor, next_ids: torch.LongTensor, start: int) -> None:
        """Take the target's features ``(1, T, k H)`` at `layer_ids` for the kept positions ``start .. start + T - 1``
        of the sequence, and the ids ``(1, T)`` of the tokens that follow them (called after every round on the
        drafters whose `layer_ids` is not ``None``); the default does nothing."""

    def observe_scores(self, tokens: torch.LongTensor, scores: torch.Tensor) -> None:
        """Take one verification pass's processed scores ``(1, k, V)`` after each of the `tokens` ``(1, k)`` it was
        fed (the last kept token, then the drafted ones, accepted or not); called after every round on the drafters
        whose `learns_from_scores` is true (after the round's replayed proposals were made); the default does
        nothing."""

    @abstractmethod
    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, torch.FloatTensor | None]:
        """Propose up to `num_tokens` tokens after `input_ids` ``(1, L)``.

        Returns:
            ``tokens`` ``(1, n)`` with ``0 <= n <= num_tokens`` and ``logits`` ``(1, n, V)``: the *processed* logits the
            tokens were chosen from (with `do_sample`, each token must be sampled from their softmax so that
            speculative sampling stays lossless), or ``None`` for a deterministic drafter. ``n = 0`` abstains from
            the round (nothing to propose, or no distribution to draft from, such as NaN logits): the round goes to
            the policy's fallback and the call goes on.
        """

    def config(self) -> dict[str, Any]:
        """Kind parameters saved in a pool's `config.json`."""
        return {}

    # ------------------------------------------------------------------ pool config round trip
    def spec_group(self) -> Hashable | None:
        """Key of the pool entry this drafter shares with its neighbours, or ``None`` (default) for an entry of its own.

        Drafters of the same class with the same non-``None`` key that stand next to each other in the pool are
        saved as **one** entry (e.g. the LoRA arms of one peft model); `to_spec` then receives them all.
        """
        return None

    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The `config.json` entry of `group` (one drafter, or the neighbours `spec_group` joined).

        Weight files are not written here: schedule them on `ctx` (``ctx.schedule(write)``), which runs them only once
        the whole pool is planned and valid. The default saves ``config()`` as `params` (checked to be JSON).
        """
        if len(group) != 1:
            raise TypeError(
                f"`{cls.__name__}.to_spec` saves one drafter per entry, but got {len(group)} that `spec_group` joined. "
                f"Override `{cls.__name__}.to_spec` (and `from_spec`) to save them as one entry, or return None from "
                "`spec_group`."
            )
        (drafter,) = group
        return DrafterSpec(kind=cls.kind, name=drafter.name, params=ctx.json_params(drafter, drafter.config()))

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The drafter(s) of one `config.json` entry, built for ``ctx.target`` (files read through `ctx`).

        The default is ``cls(name=spec.name, **spec.params)``; parameters the constructor refuses raise
        `InvalidPoolError` naming the entry.

        Example:
            >>> from hf_metasd.drafters import PromptLookupDrafter
            >>> from hf_metasd.drafters import DrafterSpec, LoadContext
            >>> spec = DrafterSpec("prompt_lookup", "pl", params={"max_matching_ngram_size": 3})
            >>> [drafter] = PromptLookupDrafter.from_spec(spec, LoadContext(specs=[spec]))
            >>> drafter.name, drafter.max_matching_ngram_size, drafter.source["stored"]
            ('pl', 3, False)
        """
        return [ctx.build(spec, cls, lambda: cls(name=spec.name, **spec.params))]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """Raise `InvalidPoolError` if `spec` cannot describe a drafter of this kind (nothing is read).

        Called by `DrafterPoolConfig.validate` after the checks every entry gets (registered kind, `path` and
        ``params.head_token_ids`` inside the pool). The default refuses `adapters`.
        """
        if spec.adapters is not None:
            raise InvalidPoolError(
                f"{where} must not have `adapters` (only `lora` drafters do), but has {spec.adapters!r}. "
                'Drop `adapters`, or use kind "lora".'
            )

    @classmethod
    def arm_names(cls, spec: DrafterSpec) -> list[str]:
        """The names of the arms `from_spec` builds from `spec` (default: one arm, ``spec.name``)."""
        return [spec.name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def check_draft(drafter: Drafter, tokens: torch.Tensor, logits: torch.Tensor | None) -> None:
    """Refuse a draft the target cannot verify, naming `drafter` (a `MetaSDDrafterError`, before the target's pass):
    `tokens` ``(1, n)`` outside ``[0, V)`` (V: the target's vocabulary, `Drafter.target_vocab`, else the
    drafter's own or its logits' width), or `logits` ``(1, n, V)`` that are no distribution at a drafted position
    (NaN, ``+inf``, every entry ``-inf``). Built-in drafters never return either; one device sync per draft.

    Example:
        >>> from hf_metasd.drafters import PromptLookupDrafter
        >>> drafter = PromptLookupDrafter()
        >>> drafter.target_vocab = 8
        >>> check_draft(drafter, torch.tensor([[3, 9]]), None)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.MetaSDDrafterError: drafter 'prompt_lookup' must return token ids in [0, 8) (the target's vocabulary), but returned 9 at draft position 1. Fix `PromptLookupDrafter.draft` to return ids of the target's vocabulary (or an empty draft to abstain).
    """
    if tokens.shape[-1] == 0:
        return
    widths = [drafter.target_vocab, drafter.vocab_size, None if logits is None else logits.shape[-1]]
    vocab = next((int(w) for w in widths if w is not None), None)
    flat = tokens.reshape(-1)
    bad = flat < 0 if vocab is None else (flat < 0) | (flat >= vocab)
    checks = [bad.any()]
    if logits is not None:
        peaks = logits.reshape(-1, logits.shape[-1])[: flat.shape[0]].amax(dim=-1)
        checks.append((~torch.isfinite(peaks)).any())
    out_of_range, *no_distribution = torch.stack([c.to(flat.device) for c in checks]).tolist()  # one sync
    fix = f"`{type(drafter).__name__}.draft`"
    if out_of_range:
        at = int(bad.nonzero()[0, 0])
        interval = "[0, " + ("inf" if vocab is None else str(vocab)) + ")"
        raise MetaSDDrafterError(
            f"drafter {drafter.name!r} must return token ids in {interval} (the target's vocabulary), but returned "
            f"{int(flat[at])} at draft position {at}. Fix {fix} to return ids of the target's vocabulary (or an "
            "empty draft to abstain)."
        )
    if no_distribution and no_distribution[0]:
        at = int((~torch.isfinite(peaks)).nonzero()[0, 0])
        raise MetaSDDrafterError(
            f"drafter {drafter.name!r} must return logits that are a distribution at every drafted position (a finite "
            f"largest entry), but returned {float(peaks[at])} at draft position {at}. Return an empty draft (it "
            f"abstains from the round) where its logits are no distribution, or fix {fix}."
        )
