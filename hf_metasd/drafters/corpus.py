"""Corpus drafter: model-free drafting from the longest suffix match of the context in a corpus (SuffixDecoding).

The drafter holds an index over a corpus of token sequences (for example the target's own past answers on one task)
and, each round, proposes what followed the longest suffix of the context (prompt + generated tokens) in the corpus
(Oliaro et al., *SuffixDecoding*, arXiv 2411.04975; this is a suffix array, not their suffix tree).

The index (`hf_metasd.drafters.corpus_index.CorpusIndex`: a suffix array, its search and its file) finds the longest
suffix of the context that occurs in the corpus, ``m`` tokens long, and the range ``[lo, hi)`` of its ``hi - lo``
occurrences (the *support*); a match never crosses a document.

**Draft.** Up to `max_occurrences` occurrences, evenly spaced in ``[lo, hi)``, vote token by token: at draft position
``j`` each remaining occurrence votes for the token that followed it (or for "document end"), the most frequent token
wins (ties: the lowest id; "document end" loses every tie), only the occurrences that voted for it remain, and drafting
stops at ``num_tokens`` tokens, at a "document end" win, or when the winner's share ``count / remaining`` falls below
`min_frequency`. Below ``m < min_match_length`` the drafter abstains (an empty draft): the round goes to another
drafter of the pool.

**Context lookup** (``context_lookup``, off by default): the context itself is searched too, as SuffixDecoding's
per-request tree is: the occurrences of the context's longest suffix that end earlier in the context (at most
`max_match_length` tokens long, from one token on, as prompt lookup falls back to a single token) are one more source
of continuations (the most recent `max_occurrences` of them, each cut where the context ends). The longer match
wins; equal ones vote together; a context match drafts even when the corpus match is shorter than
`min_match_length`. One drafter then covers both what the task's past answers repeat and what this answer copies from
its prompt (on the dev prompts, greedy, N = 3, mean tokens per round of the MT-Bench corpus: 1.28 alone, 1.59 with
context lookup, prompt lookup 1.24: docs/benchmarks_history.md). Searching the context costs one vectorised scan per
matched token.

**Online growth** (off by default, ``online_tokens=0``). With ``online_tokens > 0``, every finished `generate` call
adds its generated tokens as one more document to a bounded online store (`on_generation_end`, under a lock; the
oldest documents are dropped once more than `online_tokens` tokens are held), whose own small index is rebuilt there,
at the end of the call that added a document (about 1 s per million held tokens; drafts meanwhile use the previous
index). A query searches both indexes; the longer match wins, equal ones vote together. Memory is bounded by
`online_tokens`: about 16 bytes per held token (4 for the documents, 12 for their index).
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .._validation import check_int, check_real
from ..errors import DrafterCompatibilityError, InvalidPoolError
from .base import Drafter
from .candidates import CandidateDrafter, IsAllowed, allowed_prefix
from .corpus_index import (
    CORPUS_FILE,
    MAX_TOKEN_ID,
    CorpusIndex,
    OnlineStore,
    context_continuations,
    context_match,
    read_corpus,
    write_corpus,
)
from .load import LoadContext
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import DrafterSpec, check_at_most
from .vocab import target_vocab_size

__all__ = ["CorpusDrafter"]

#: The upper bound of each number a pool file sets for a corpus entry (the constructor checks types and lower bounds).
POOL_MAXIMA: dict[str, float] = {
    "max_match_length": 1024,
    "min_match_length": 1024,
    "max_occurrences": 4096,
    "min_frequency": 1.0,
    "online_tokens": 10_000_000,
    "vocab_size": MAX_TOKEN_ID + 1,
}


# ---------------------------------------------------------------------------------------------------------------------
# settings checks: "`arg` must X, but is V. Do Y."
# ---------------------------------------------------------------------------------------------------------------------
def _check_int(name: str, value: Any, *, minimum: int, example: int) -> int:
    """A `TypeError` for a non-int (bools too), then the shared range check (`ValueError`)."""
    if isinstance(value, np.integer):
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be an int, but is {type(value).__name__} {value!r}. Use e.g. {example}.")
    return check_int(name, value, low=minimum, hint=f"Use e.g. {example}.")


def _check_fraction(name: str, value: Any, example: float) -> float:
    """A `TypeError` for a non-number, then the shared range check ``[0, 1]`` (`ValueError`)."""
    if not isinstance(value, (int, float, np.floating)) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be a float, but is {type(value).__name__} {value!r}. Use e.g. {example}.")
    return check_real(name, float(value), low=0.0, high=1.0, hint=f"Use e.g. {example}.")


def _vote(rows: list[list[int]], num_tokens: int, min_frequency: float) -> list[int]:
    """The greedy token-by-token vote over continuation rows (-1 = document end); see the module docstring.

    Example:
        >>> _vote([[4, 5], [4, 6], [4, 6], [3, -1]], 2, 0.0)     # 4 (3 of 4 votes), then 6 (2 of 3)
        [4, 6]
        >>> _vote([[4, 5], [4, 6], [4, 6], [3, -1]], 2, 0.7)     # 2/3 < 0.7: stop after 4
        [4]
        >>> _vote([[5, 1], [4, 2], [-1, 0]], 2, 0.0)              # a three-way tie: the lowest id, then unanimous
        [4, 2]
    """
    draft: list[int] = []
    alive = rows
    for j in range(min(num_tokens, len(rows[0]) if rows else 0)):
        column = [row[j] for row in alive]
        token, votes = column[0], column.count(column[0])
        if votes < len(column):  # not unanimous: count; most votes, ties to the lowest id, "end" (-1) losing ties
            token, votes = min(Counter(column).items(), key=lambda kv: (-kv[1], kv[0] < 0, kv[0]))
        if token < 0 or votes < min_frequency * len(alive):
            break
        draft.append(token)
        if votes < len(alive):
            alive = [row for row, t in zip(alive, column) if t == token]
    return draft


# ---------------------------------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------------------------------
@register_drafter_kind
class CorpusDrafter(CandidateDrafter):
    """Model-free drafter that proposes the continuation of the context's longest suffix match in a corpus.

    Semantics (match, vote, abstention, online growth) are in the module docstring. It has no logits
    (``returns_logits = False``: BD scores it as one-hot, sampling falls back to token matching, both lossless) and no
    catch-up cost. A `draft` call costs a few binary searches over the suffix array: tens of microseconds on a
    million-token corpus, far below a target step. Build it with `from_sequences` or `from_folder`. A pool always
    stores the corpus inside its folder (``corpus/<name>/corpus.safetensors``), whatever `store_weights` says.

    Args:
        index: the static `CorpusIndex` (shared, read-only).
        max_match_length: most context tokens matched, ``L`` (default 16). Longer is more selective and costs more.
        min_match_length: shortest match that drafts (default 2); below it the drafter abstains. Larger abstains more
            often and drafts more reliably.
        max_occurrences: most occurrences that vote (default 64).
        min_frequency: the draft stops where the winning token's share of the remaining occurrences is below this
            (default 0.25; 0: never). Larger gives shorter, safer drafts. Both defaults were chosen with
            `recipes/studies/bench_corpus_index.py` on the default target's own answers (greedy acceptance of held-out answers).
        context_lookup: also search the context (prompt + generated tokens) for its longest earlier suffix match,
            from one token on (default ``False``); see the module docstring.
        online_tokens: capacity of the online store in tokens (default 0: off). See `on_generation_end`.
        vocab_size: the vocabulary size of the tokenizer the corpus was made with (default ``None``: unknown); when
            set, `check_compatible` requires the target to have it. Logits processors are applied to drafts with the
            target's logits width, which `spawn(target)` keeps on the call's copy (or `vocab_size` before that).
        name: label (default ``"corpus"``).

    Attributes:
        last_match_length: ``m`` of the last `draft` (0: no match).
        last_support: occurrences of that match in the corpus (static + online) and, with `context_lookup`, the
            context.

    Example:
        >>> import torch
        >>> drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5], [7, 2, 3, 4, 6], [8, 2, 3, 4, 6]])
        >>> tokens, logits = drafter.draft(torch.tensor([[9, 2, 3]]), 3)   # "2 3" occurs 3 times: 4, then 6 (2 of 3)
        >>> tokens.tolist(), logits, drafter.last_match_length, drafter.last_support
        ([[4, 6]], None, 2, 3)
        >>> drafter.draft(torch.tensor([[9, 2, 3]]), 1)[0].tolist()          # capped by num_tokens
        [[4]]
        >>> drafter.draft(torch.tensor([[9, 3, 1]]), 3)[0].shape              # "1" alone is too short: abstain
        torch.Size([1, 0])
    """

    kind = "corpus"
    replayable = True
    scores_matches = True

    def __init__(
        self,
        index: CorpusIndex,
        *,
        max_match_length: int = 16,
        min_match_length: int = 2,
        max_occurrences: int = 64,
        min_frequency: float = 0.25,
        context_lookup: bool = False,
        online_tokens: int = 0,
        vocab_size: int | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(index, CorpusIndex):
            raise TypeError(
                f"`index` must be a `CorpusIndex`, but is {type(index).__name__}. "
                "Build the drafter with `CorpusDrafter.from_sequences(...)` or `CorpusDrafter.from_folder(...)`."
            )
        self.max_match_length = _check_int("max_match_length", max_match_length, minimum=1, example=16)
        self.min_match_length = _check_int("min_match_length", min_match_length, minimum=1, example=2)
        if self.min_match_length > self.max_match_length:
            raise ValueError(
                f"`min_match_length` must be <= `max_match_length` ({self.max_match_length}), but is "
                f"{min_match_length}. Lower `min_match_length` or raise `max_match_length`."
            )
        self.max_occurrences = _check_int("max_occurrences", max_occurrences, minimum=1, example=64)
        self.min_frequency = _check_fraction("min_frequency", min_frequency, 0.25)
        if not isinstance(context_lookup, bool):
            raise TypeError(f"`context_lookup` must be True or False, but is {context_lookup!r}. Pass a bool.")
        self.context_lookup = context_lookup
        self.online_tokens = _check_int("online_tokens", online_tokens, minimum=0, example=100_000)
        if vocab_size is not None:
            vocab_size = _check_int("vocab_size", vocab_size, minimum=1, example=49152)
            if index.max_token_id >= vocab_size:
                raise ValueError(
                    f"`vocab_size` must exceed every corpus token id, but is {vocab_size} while the corpus holds id "
                    f"{index.max_token_id}. Pass the target's vocabulary size, or build the corpus with its tokenizer."
                )
        super().__init__(name)
        self.index = index
        self._vocab_size = vocab_size
        self._logits_width = vocab_size  # until `spawn(target)` sets the target's: logits processors need it
        self._online = OnlineStore(self.online_tokens) if self.online_tokens else None
        self.reset()

    # ------------------------------------------------------------------ construction and serialisation
    @classmethod
    def from_sequences(cls, sequences: Iterable[Any], *, name: str | None = None, **settings: Any) -> CorpusDrafter:
        """A drafter over `sequences` (token-id lists, one per document); `settings` are the constructor's."""
        return cls(CorpusIndex.from_sequences(sequences), name=name, **settings)

    def save_corpus(self, folder: str | Path) -> Path:
        """Write the static corpus and its suffix array to ``folder/corpus.safetensors`` (not the online store; see
        `hf_metasd.drafters.corpus_index.write_corpus`), so that `from_folder` does not rebuild the index. Returns the
        file's path."""
        return write_corpus(self.index, folder, vocab_size=self._vocab_size)

    @classmethod
    def from_folder(cls, folder: str | Path, *, name: str | None = None, **settings: Any) -> CorpusDrafter:
        """Load a drafter saved by `save_corpus`; `settings` are the constructor's (`vocab_size` defaults to the saved
        one).

        Raises:
            FileNotFoundError: `folder` holds no ``corpus.safetensors``.
            ValueError: the file is truncated, corrupt, or not a corpus of this format.

        Example:
            >>> import tempfile
            >>> drafter = CorpusDrafter.from_sequences([[1, 2, 3, 4]], vocab_size=8)
            >>> with tempfile.TemporaryDirectory() as folder:
            ...     _ = drafter.save_corpus(folder)
            ...     loaded = CorpusDrafter.from_folder(folder, name="c")
            >>> loaded.index.documents(), loaded.vocab_size, loaded.name
            ([[1, 2, 3, 4]], 8, 'c')
        """
        index, saved_vocab_size = read_corpus(folder)
        if saved_vocab_size is not None and "vocab_size" not in settings:
            settings["vocab_size"] = saved_vocab_size
        return cls(index, name=name, **settings)

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The settings as `params`; the corpus is **always** stored in the pool, at ``corpus/<name>/`` (a corpus has
        no source to reference). The online store is not saved.

        Ranges of `params` in a pool file (the constructor's, plus the upper bounds `POOL_MAXIMA` that `validate_spec`
        checks): ``max_match_length`` in [1, 1024], ``min_match_length`` in [1, ``max_match_length``],
        ``max_occurrences`` in [1, 4096], ``min_frequency`` in [0, 1], ``online_tokens`` in [0, 10,000,000] (about
        160 MB held), ``vocab_size`` null or in [1, 2**31]."""
        (drafter,) = group
        folder = ctx.folder("corpus", drafter.name)
        ctx.schedule(lambda root: drafter.save_corpus(root / folder))
        params = ctx.json_params(drafter, drafter.config())
        return DrafterSpec(cls.kind, drafter.name, path=folder, stored=True, params=params)

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The corpus of ``<pool>/<path>/corpus.safetensors`` with the entry's settings (`from_folder`)."""
        where = ctx.where(spec)
        folder = Path(ctx.resolve(spec, where, need_folder=True))
        try:
            index, saved_vocab_size = read_corpus(folder)
        except (FileNotFoundError, ValueError) as err:
            raise InvalidPoolError(
                f"{where} must find a readable corpus at {str(folder / CORPUS_FILE)!r}, but it cannot be read: {err} "
                "Restore the file, or re-save the pool from a working copy of the drafter."
            ) from err
        settings = dict(spec.params)
        if saved_vocab_size is not None and "vocab_size" not in settings:
            settings["vocab_size"] = saved_vocab_size
        return [ctx.build(spec, cls, lambda: cls(index, name=spec.name, **settings))]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A corpus entry is stored in the pool (``stored: true`` and a `path`), without `adapters`, its numbers at most
        `POOL_MAXIMA`."""
        for key, high in POOL_MAXIMA.items():
            check_at_most(spec.params.get(key), f"{where} `params.{key}`", high)
        if not spec.stored or not spec.path:
            raise InvalidPoolError(
                f'{where} must be stored in the pool (`stored: true` and a `path` such as "corpus/{spec.name}"), but '
                f"has stored={spec.stored!r}, path={spec.path!r}. Re-save the pool with `DrafterPool.save_pretrained`."
            )
        super().validate_spec(spec, where)

    def config(self) -> dict[str, Any]:
        """The settings (JSON-able; the corpus itself is saved by `save_corpus`)."""
        return {
            "max_match_length": self.max_match_length,
            "min_match_length": self.min_match_length,
            "max_occurrences": self.max_occurrences,
            "min_frequency": self.min_frequency,
            "context_lookup": self.context_lookup,
            "online_tokens": self.online_tokens,
            "vocab_size": self._vocab_size,
        }

    # ------------------------------------------------------------------ protocol
    @property
    def vocab_size(self) -> int | None:
        """The target vocabulary size given at construction, or ``None`` (then any target with the ids works)."""
        return self._vocab_size

    def check_compatible(self, target: Any) -> None:
        """The target must have `vocab_size` (when set) and every corpus id in its vocabulary. No side effects: what a
        call needs to know about the target goes on its `spawn` copy."""
        super().check_compatible(target)
        width = target_vocab_size(target)
        if self.index.max_token_id >= width:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must hold token ids below the target's vocabulary size {width}, but its corpus "
                f"holds id {self.index.max_token_id}. Build the corpus with the target's tokenizer."
            )

    def reset(self) -> None:
        """Per-call telemetry, assigned fresh (the indexes and the online store are shared by `spawn` copies)."""
        self.last_match_length = 0
        self.last_support = 0

    def on_generation_end(self, sequence: torch.LongTensor, prompt_length: int) -> None:
        """With ``online_tokens > 0``: add ``sequence[0, prompt_length:]`` to the online store (thread-safe).

        The oldest online documents are dropped once more than `online_tokens` tokens are held, and the online index
        is rebuilt here (on the finishing call's thread, about 1 s per million held tokens). Later `draft` calls, of
        this drafter and of every copy `spawn` made, search the new document too. Without the store: nothing.
        """
        if self._online is None:
            return
        generated = sequence.reshape(-1)[prompt_length:].detach().cpu().numpy()
        self._online.add(generated.astype(np.int32))

    @property
    def online_held_tokens(self) -> int:
        """Tokens in the online store (0 when off)."""
        return 0 if self._online is None else self._online.held_tokens

    def propose(self, context: Sequence[int] | np.ndarray, num_tokens: int) -> list[int]:
        """The draft for a context given as ids (a list or a 1-D array; no logits processors): the core of `draft`."""
        if num_tokens < 1 or len(context) == 0:
            self.last_match_length = self.last_support = 0
            return []
        tail = [int(t) for t in context[-self.max_match_length :]]
        query = struct.pack(f">{len(tail)}I", *reversed(tail))
        indexes = [self.index] if self._online is None else [self.index, self._online.index()]
        best, found = 0, []
        for index in indexes:
            m, lo, hi = index.match(query)
            if m > best:
                best, found = m, [(index, lo, hi)]
            elif m == best and m > 0:
                found.append((index, lo, hi))
        support = sum(hi - lo for _, lo, hi in found)
        self.last_match_length, self.last_support = best, support
        if best < self.min_match_length:
            found, support = [], 0
        rows: list[list[int]] = []
        if self.context_lookup:
            ids = np.asarray(context, dtype=np.int64)
            m, ends = context_match(ids, self.max_match_length)
            if m > 0 and (m >= best or not found):  # the context's match is as long, or the corpus's cannot draft
                if m > best or not found:  # ... longer, or alone: the corpus's occurrences do not vote
                    found, support = [], 0
                rows = context_continuations(ids, ends, self.max_occurrences, num_tokens)
                self.last_match_length, self.last_support = max(m, best), support + len(rows)
        if not found and not rows:
            return []
        for index, lo, hi in found:
            share = max(1, (self.max_occurrences * (hi - lo)) // support)
            rows += index.continuations(lo, hi, share, num_tokens)
        return _vote(rows, num_tokens, self.min_frequency)

    def candidates(self, input_ids: torch.LongTensor, num_tokens: int, is_allowed: IsAllowed | None) -> torch.Tensor:
        """`propose` on the context of `input_ids` ``(1, L)``, as a tensor cut where `is_allowed` forbids a token."""
        if self.context_lookup:
            context: Any = input_ids[0].detach().cpu().numpy()
        else:
            context = input_ids[0, -self.max_match_length :].tolist()
        proposal = torch.tensor(self.propose(context, num_tokens), dtype=input_ids.dtype, device=input_ids.device)
        return allowed_prefix(proposal, input_ids, is_allowed)

    def __repr__(self) -> str:
        return (
            f"CorpusDrafter(name={self.name!r}, documents={self.index.num_documents}, tokens={self.index.num_tokens}, "
            f"online_tokens={self.online_tokens})"
        )
