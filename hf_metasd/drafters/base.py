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

from ..errors import DrafterCompatibilityError

__all__ = ["Drafter", "eval_mode", "is_peft_model", "require_peft", "shared_scope", "target_vocab_size"]

_SCOPES: dict[Hashable, list[Any]] = {}
_SCOPES_LOCK = threading.Lock()


@contextmanager
def shared_scope(key: Hashable, enter: Callable[[], Any], leave: Callable[[Any], None]) -> Iterator[None]:
    """A change of shared state that concurrent calls make together: the first call in runs ``state = enter()``,
    the last one out runs ``leave(state)``; calls in between find the change already made.

    This is how a call puts a user's module in eval mode (or on an adapter) and gives it back as it was, even when
    several threads draft with the same module at once.

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


def is_peft_model(obj: Any) -> bool:
    """Whether `obj` is a peft model (checked without importing peft)."""
    return type(obj).__module__.startswith("peft.") and hasattr(obj, "peft_config")


def require_peft(what: str) -> Any:
    """Import peft, or raise an `ImportError` saying that `what` needs it and which extra to install."""
    try:
        import peft
    except ImportError as err:  # pragma: no cover - peft is installed in the test environment
        raise ImportError(
            f"{what} `peft`, but it is not installed. Install it with `pip install hf-metasd[peft]`."
        ) from err
    return peft


def target_vocab_size(model: Any) -> int:
    """The logits width of a causal LM (its text config's `vocab_size`)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


class Drafter(ABC):
    """One drafter. Subclasses set `kind` and implement `catch_up`, `draft` and `reset`.

    Attributes:
        name: label used in telemetry, plots and pool configs.
        last_catch_up_tokens: tokens ingested by the last `catch_up` (0 for model-free drafters).
    """

    #: Registry key of the drafter kind (`"assistant_model"`, `"prompt_lookup"`, ...).
    kind: ClassVar[str] = ""
    #: Whether `draft` returns logits (``False``: deterministic drafter, BD treats it as one-hot).
    returns_logits: ClassVar[bool] = True

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
            speculative sampling stays lossless), or ``None`` for a deterministic drafter.
        """

    def config(self) -> dict[str, Any]:
        """Kind parameters saved in a pool's `config.json`."""
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
