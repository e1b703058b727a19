"""Corpus drafter: model-free drafting from the longest suffix match of the context in a corpus (SuffixDecoding).

The drafter holds an index over a corpus of token sequences (for example the target's own past answers on one task)
and, each round, proposes what followed the longest suffix of the context (prompt + generated tokens) in the corpus
(Oliaro et al., *SuffixDecoding*, arXiv 2411.04975; this is a suffix array, not their suffix tree).

**Index.** The documents ``d_1 .. d_k`` are concatenated as ``F = d_1 # d_2 # ... d_k #`` with a separator ``#``
that no context contains, and ``R = reverse(F)`` is stored as big-endian ``uint32`` bytes, so that comparing two
`bytes` slices compares token sequences lexicographically. The suffix array ``SA`` lists the start positions of
``R``'s suffixes in sorted order (built by prefix doubling with numpy, about 1 s per million tokens). A suffix of the
context ``c`` that occurs in the corpus is a prefix of ``reverse(c)`` that starts a suffix of ``R``, so the longest
such match is one binary search: with ``q = reverse(c)[:max_match_length]`` and ``i`` the insertion point of ``q`` in
``SA``, the match length is ``m = max(lcp(q, R[SA[i-1]:]), lcp(q, R[SA[i]:]))``, and the ``s = hi - lo`` suffixes that
share those ``m`` tokens (the *support*) are the range ``[lo, hi)`` found by two more binary searches. A match never
crosses a document (it would have to match ``#``), and a continuation stops at the next ``#``.

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
context lookup, prompt lookup 1.24: docs/benchmarks.md). Searching the context costs one vectorised scan per
matched token.

**Online growth** (off by default, ``online_tokens=0``). With ``online_tokens > 0``, every finished `generate` call
adds its generated tokens as one more document to a bounded online store (`on_generation_end`, under a lock; the
oldest documents are dropped once more than `online_tokens` tokens are held), whose own small index is rebuilt there,
at the end of the call that added a document (about 1 s per million held tokens; drafts meanwhile use the previous
index). A query searches both indexes; the longer match wins, equal ones vote together. Memory is bounded by
`online_tokens`: about 16 bytes per held token (4 for the documents, 12 for their index).
"""

from __future__ import annotations

import bisect
import struct
import threading
import warnings
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._validation import check_int, check_real
from ..errors import DrafterCompatibilityError, InvalidPoolError
from . import register_drafter_kind
from .base import Drafter, target_vocab_size
from .prompt_lookup import logits_processor_filter

if TYPE_CHECKING:
    from ..pool.config import DrafterSpec
    from ..pool.weights import LoadContext, SaveContext

__all__ = ["CorpusDrafter", "CorpusIndex", "build_suffix_array", "context_continuations", "context_match"]

#: file written by `CorpusDrafter.save_corpus`.
CORPUS_FILE = "corpus.safetensors"
#: bump when the file layout changes.
FORMAT_VERSION = "1"
#: the document separator in the reversed corpus: above every valid token id (ids are int32), so it never matches.
SEPARATOR = 0xFFFFFFFF
_MAX_TOKEN_ID = 2**31 - 1
#: The upper bound of each number a pool file sets for a corpus entry (the constructor checks types and lower bounds).
POOL_MAXIMA: dict[str, float] = {
    "max_match_length": 1024,
    "min_match_length": 1024,
    "max_occurrences": 4096,
    "min_frequency": 1.0,
    "online_tokens": 10_000_000,
    "vocab_size": _MAX_TOKEN_ID + 1,
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


def _as_document(i: int, sequence: Any) -> np.ndarray:
    """One document as a 1-D int32 array, or a clear error naming `sequences[i]`."""
    if isinstance(sequence, torch.Tensor):
        sequence = sequence.detach().cpu().numpy()
    if isinstance(sequence, (str, bytes)) or not isinstance(sequence, (Sequence, np.ndarray)):
        raise TypeError(
            f"`sequences[{i}]` must be a list of token ids, but is {type(sequence).__name__}. "
            "Pass e.g. `[[1, 2, 3], [4, 5]]` (tokenize text first)."
        )
    array = np.asarray(sequence)
    if array.size == 0:
        return np.zeros(0, dtype=np.int32)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"`sequences[{i}]` must be a flat list of int token ids, but has shape {array.shape} and dtype "
            f"{array.dtype}. Pass one list of ints per document."
        )
    low, high = int(array.min()), int(array.max())
    if low < 0 or high > _MAX_TOKEN_ID:
        bad = low if low < 0 else high
        raise ValueError(
            f"`sequences[{i}]` must hold token ids in [0, {_MAX_TOKEN_ID}], but holds {bad}. "
            "Pass the target tokenizer's ids (drop padding such as -100)."
        )
    return array.astype(np.int32)


# ---------------------------------------------------------------------------------------------------------------------
# the index
# ---------------------------------------------------------------------------------------------------------------------
def build_suffix_array(values: np.ndarray) -> np.ndarray:
    """Suffix array of `values` by prefix doubling: ``SA[r]`` is the start of the ``r``-th smallest suffix.

    Order: lexicographic over the values, a proper prefix before its extensions (as `bytes` comparison does).
    Ranks after round ``t`` sort the suffixes by their first ``2**t`` values; each round is one `argsort` of the pairs
    ``(rank[i], rank[i + 2**t])``, and it stops once all ranks differ (``log2`` of the longest repeat rounds).

    Args:
        values: ``(N,)`` non-negative integers (any integer dtype).

    Returns:
        ``(N,)`` int32 positions.

    Example:
        >>> import numpy as np
        >>> build_suffix_array(np.array([2, 1, 2, 1])).tolist()   # suffixes 1, 1 2 1, 2 1, 2 1 2 1
        [3, 1, 2, 0]
    """
    n = len(values)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    _, rank = np.unique(np.asarray(values), return_inverse=True)
    rank = rank.astype(np.int64).reshape(-1)
    order = np.argsort(rank, kind="stable")
    step = 1
    while step < n:
        second = np.zeros(n, dtype=np.int64)  # 0 = past the end: shorter suffixes sort first
        second[: n - step] = rank[step:] + 1
        key = rank * (n + 1) + second  # < 2**62 for n < 2**31
        order = np.argsort(key)
        sorted_key = key[order]
        new_rank = np.empty(n, dtype=np.int64)
        changed = np.empty(n, dtype=np.int64)
        changed[0] = 0
        np.not_equal(sorted_key[1:], sorted_key[:-1], out=changed[1:])
        new_rank[order] = np.cumsum(changed)
        rank = new_rank
        if rank.max() == n - 1:
            break
        step *= 2
    return order.astype(np.int32)


def _common_prefix_tokens(a: bytes, b: bytes) -> int:
    """Number of leading 4-byte tokens `a` and `b` share (binary search on slice equality)."""
    low, high = 0, min(len(a), len(b)) // 4
    while low < high:
        mid = (low + high + 1) // 2
        if a[: 4 * mid] == b[: 4 * mid]:
            low = mid
        else:
            high = mid - 1
    return low


class CorpusIndex:
    """Read-only suffix-array index over the reversed concatenation of token documents (see the module docstring).

    Build it with `from_sequences`; `CorpusDrafter` wraps it. Several drafters (and threads) can share one index.

    Attributes:
        num_documents: ``k``.
        num_tokens: corpus tokens, separators excluded.
        max_token_id: the largest id in the corpus (-1 when empty).

    Example:
        >>> index = CorpusIndex.from_sequences([[1, 2, 3, 4], [9, 2, 3, 5]])
        >>> m, lo, hi = index.match([3, 2, 1])        # reversed context "... 1 2 3": longest suffix in the corpus
        >>> m, hi - lo                                 # "1 2 3" occurs once
        (3, 1)
        >>> index.continuations(lo, hi, 64, 4)        # followed by 4, then the document end (-1)
        [[4, -1, -1, -1]]
    """

    def __init__(self, tokens: np.ndarray, offsets: np.ndarray, suffix_array: np.ndarray | None = None) -> None:
        """From the concatenated documents `tokens` ``(T,)``, their starts `offsets` ``(k+1,)`` (``0 .. T``), and
        optionally the suffix array ``(T+k,)`` of ``R`` (as `save_corpus` stored it; built when ``None``)."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        self._offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        self.num_documents = len(self._offsets) - 1
        self.num_tokens = len(tokens)
        self.max_token_id = int(tokens.max()) if self.num_tokens else -1
        # F = d_1 # d_2 # ... d_k #  (uint32; # = SEPARATOR), and R = reverse(F)
        n = self.num_tokens + self.num_documents
        forward = np.full(n, SEPARATOR, dtype=np.uint32)
        keep = np.ones(n, dtype=bool)
        keep[self._offsets[1:] + np.arange(self.num_documents)] = False
        forward[keep] = tokens  # the documents are not kept twice: `arrays` reads them back from F
        self._forward = forward
        self._length = n
        reversed_ = forward[::-1]
        self._reversed_bytes = reversed_.astype(">u4").tobytes()
        if suffix_array is None:
            suffix_array = build_suffix_array(reversed_)
        self._suffix_array = np.ascontiguousarray(suffix_array, dtype=np.int32)
        self._sa = memoryview(self._suffix_array)  # indexing gives Python ints: fast `bisect`

    @classmethod
    def from_sequences(cls, sequences: Iterable[Any]) -> CorpusIndex:
        """Index a list of documents (lists, 1-D arrays or tensors of token ids)."""
        if isinstance(sequences, (str, bytes, torch.Tensor)) or not isinstance(sequences, Iterable):
            raise TypeError(
                f"`sequences` must be a list of token-id lists, but is {type(sequences).__name__}. "
                "Pass e.g. `[[1, 2, 3], [4, 5]]`."
            )
        documents = [_as_document(i, s) for i, s in enumerate(sequences)]
        lengths = np.array([len(d) for d in documents], dtype=np.int64)
        if lengths.sum() + len(documents) > _MAX_TOKEN_ID:
            raise ValueError(
                f"`sequences` must hold fewer than {_MAX_TOKEN_ID} tokens, but holds {int(lengths.sum())}. "
                "Split the corpus into several drafters."
            )
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = np.concatenate(documents) if documents else np.zeros(0, dtype=np.int32)
        return cls(tokens, offsets)

    @property
    def nbytes(self) -> int:
        """Bytes held by the index arrays (offsets, forward and reversed corpus, suffix array): ~12 per token."""
        arrays = (self._offsets, self._forward, self._suffix_array)
        return sum(a.nbytes for a in arrays) + len(self._reversed_bytes)

    def documents(self) -> list[list[int]]:
        """The indexed documents as lists of ids."""
        tokens = self.arrays()["tokens"]
        return [tokens[a:b].tolist() for a, b in zip(self._offsets[:-1], self._offsets[1:])]

    def arrays(self) -> dict[str, np.ndarray]:
        """What `save_corpus` stores: ``tokens`` (T,) int32, ``offsets`` (k+1,) int64, ``suffix_array`` (T+k,) int32."""
        tokens = self._forward[self._forward != SEPARATOR].astype(np.int32)
        return {"tokens": tokens, "offsets": self._offsets, "suffix_array": self._suffix_array}

    def spot_check(self, samples: int = 1024, depth: int = 64) -> bool:
        """Whether `samples` evenly spaced neighbour pairs of the suffix array are in order (on their first `depth`
        tokens): a cheap check of a suffix array read from a file (a full one costs as much as a rebuild)."""
        n, data, sa = self._length, self._reversed_bytes, self._sa
        if n < 2:
            return True
        ranks = range(n - 1) if n - 1 <= samples else ((i * (n - 1)) // samples for i in range(samples))
        width = 4 * depth
        return all(data[4 * sa[r] : 4 * sa[r] + width] <= data[4 * sa[r + 1] : 4 * sa[r + 1] + width] for r in ranks)

    def match(self, reversed_context: Sequence[int] | bytes) -> tuple[int, int, int]:
        """Longest prefix of `reversed_context` that starts a suffix of ``R``: ``(m, lo, hi)``.

        Args:
            reversed_context: the context's last tokens, **last first** (ints, or their big-endian uint32 bytes).

        Returns:
            ``m`` the match length in tokens (0: none) and ``[lo, hi)`` the suffix-array range of the ``hi - lo``
            occurrences of those ``m`` tokens (empty when ``m = 0``).
        """
        query = (
            reversed_context
            if isinstance(reversed_context, bytes)
            else struct.pack(f">{len(reversed_context)}I", *reversed_context)
        )
        n, width = self._length, len(query)
        if n == 0 or width == 0:
            return 0, 0, 0
        data, sa = self._reversed_bytes, self._sa
        where = bisect.bisect_left(sa, query, key=lambda p: data[4 * p : 4 * p + width])
        m = 0
        for r in (where - 1, where):
            if 0 <= r < n:
                p = sa[r]
                m = max(m, _common_prefix_tokens(data[4 * p : 4 * p + width], query))
        if m == 0:
            return 0, where, where
        prefix, width = query[: 4 * m], 4 * m
        lo = bisect.bisect_left(sa, prefix, 0, where, key=lambda p: data[4 * p : 4 * p + width])
        hi = bisect.bisect_right(sa, prefix, where, n, key=lambda p: data[4 * p : 4 * p + width])
        return m, lo, hi

    def continuations(self, lo: int, hi: int, max_occurrences: int, length: int) -> list[list[int]]:
        """The `length` tokens that follow up to `max_occurrences` occurrences in ``[lo, hi)`` (evenly spaced).

        Each row is cut by its document end: positions from there on are -1.
        """
        count = hi - lo
        if count <= 0 or length <= 0:
            return []
        if count <= max_occurrences:
            ranks = np.arange(lo, hi)
        else:
            ranks = lo + (np.arange(max_occurrences, dtype=np.int64) * count) // max_occurrences
        # R[p] = F[N-1-p]; the match covers R[p : p+m], i.e. F up to N-1-p, so the continuation starts at N-p.
        starts = self._length - self._suffix_array[ranks].astype(np.int64)
        window = self._forward[np.minimum(starts[:, None] + np.arange(length), self._length - 1)].astype(np.int64)
        ended = np.maximum.accumulate(window == SEPARATOR, axis=1)
        window[ended] = -1
        return window.tolist()


def context_match(context: np.ndarray, max_match_length: int) -> tuple[int, np.ndarray]:
    """The longest suffix of `context` that also ends earlier in it: ``(m, ends)``.

    Args:
        context: ``(L,)`` token ids.
        max_match_length: longest suffix tried.

    Returns:
        ``m`` (0 when the last token never occurred before) and the positions ``i < L - 1`` where an occurrence ends
        (``context[i - m + 1 : i + 1] == context[L - m :]``), ascending.

    Example:
        >>> import numpy as np
        >>> context_match(np.array([5, 6, 7, 1, 6, 7, 2, 6, 7]), 16)   # "6 7" ends at 2 and 5; "7 6 7"/"2 6 7" do not
        (2, array([2, 5]))
        >>> context_match(np.array([1, 2, 3]), 16)
        (0, array([], dtype=int64))
    """
    length = len(context)
    ends = np.nonzero(context[: length - 1] == context[length - 1])[0] if length > 1 else np.zeros(0, dtype=np.int64)
    if len(ends) == 0:
        return 0, ends
    m = 1
    while m < min(max_match_length, length):
        longer = ends[ends >= m]
        longer = longer[context[longer - m] == context[length - 1 - m]]
        if len(longer) == 0:
            break
        ends, m = longer, m + 1
    return m, ends


def context_continuations(context: np.ndarray, ends: np.ndarray, max_occurrences: int, length: int) -> list[list[int]]:
    """The `length` tokens after each of the last `max_occurrences` of `ends` in `context`, -1 past its end.

    Example:
        >>> import numpy as np
        >>> context_continuations(np.array([5, 6, 7, 1, 6, 7, 2, 6, 7]), np.array([2, 5]), 64, 3)
        [[1, 6, 7], [2, 6, 7]]
        >>> context_continuations(np.array([4, 4, 4]), np.array([0, 1]), 1, 2)   # the most recent only, cut at the end
        [[4, -1]]
    """
    if length <= 0 or len(ends) == 0:
        return []
    chosen = ends[-max_occurrences:].astype(np.int64)
    positions = chosen[:, None] + 1 + np.arange(length)
    window = context[np.minimum(positions, len(context) - 1)].astype(np.int64)
    window[positions >= len(context)] = -1
    return window.tolist()


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
# online store
# ---------------------------------------------------------------------------------------------------------------------
class _OnlineStore:
    """Bounded FIFO of generated documents and their `CorpusIndex`; one store is shared by a drafter's spawns.

    `add` rebuilds the index from a snapshot of the documents outside the lock and installs it unless a newer one was
    installed meanwhile, so a query (`index`) never waits for a build: it reads the latest installed index.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._documents: deque[np.ndarray] = deque()
        self._held = 0
        self._version = 0
        self._installed = 0
        self._index = CorpusIndex.from_sequences([])

    @property
    def held_tokens(self) -> int:
        return self._held

    def add(self, tokens: np.ndarray) -> None:
        tokens = tokens[: self.capacity]  # a document longer than the store keeps its first `capacity` tokens
        if len(tokens) == 0:
            return
        with self._lock:
            self._documents.append(tokens)
            self._held += len(tokens)
            while self._held > self.capacity:
                self._held -= len(self._documents.popleft())
            self._version += 1
            version, snapshot = self._version, list(self._documents)
        index = CorpusIndex.from_sequences(snapshot)
        with self._lock:
            if version > self._installed:
                self._index, self._installed = index, version

    def index(self) -> CorpusIndex:
        return self._index


# ---------------------------------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------------------------------
@register_drafter_kind
class CorpusDrafter(Drafter):
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
    returns_logits = False
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
        self._logits_width = vocab_size  # the target's, set by `spawn(target)`: logits processors need it
        self._online = _OnlineStore(self.online_tokens) if self.online_tokens else None
        self.reset()

    # ------------------------------------------------------------------ construction and serialisation
    @classmethod
    def from_sequences(cls, sequences: Iterable[Any], *, name: str | None = None, **settings: Any) -> CorpusDrafter:
        """A drafter over `sequences` (token-id lists, one per document); `settings` are the constructor's."""
        return cls(CorpusIndex.from_sequences(sequences), name=name, **settings)

    def save_corpus(self, folder: str | Path) -> Path:
        """Write the static corpus and its suffix array to ``folder/corpus.safetensors`` (the online store is not saved).

        Tensors: ``tokens`` (T,) int32, ``offsets`` (k+1,) int64 document starts, ``suffix_array`` (T+k,) int32, so that
        `from_folder` does not rebuild the index. Returns the file's path.
        """
        from safetensors.numpy import save_file

        path = Path(folder) / CORPUS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        metadata = {"format": "hf_metasd.corpus", "version": FORMAT_VERSION}
        if self._vocab_size is not None:
            metadata["vocab_size"] = str(self._vocab_size)
        save_file(self.index.arrays(), str(path), metadata=metadata)
        return path

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
        index, saved_vocab_size = cls._read_corpus(folder)
        if saved_vocab_size is not None and "vocab_size" not in settings:
            settings["vocab_size"] = saved_vocab_size
        return cls(index, name=name, **settings)

    @classmethod
    def _read_corpus(cls, folder: str | Path) -> tuple[CorpusIndex, int | None]:
        """The index stored in ``folder/corpus.safetensors`` and the saved `vocab_size` (checked, see `from_folder`)."""
        from safetensors import SafetensorError, safe_open

        path = Path(folder) / CORPUS_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"`folder` must hold `{CORPUS_FILE}`, but {str(path)!r} does not exist. "
                "Write it with `drafter.save_corpus(folder)`."
            )
        fix = f"Re-create it with `CorpusDrafter.from_sequences(...).save_corpus({str(folder)!r})`."
        try:
            with safe_open(str(path), framework="numpy") as handle:
                metadata = handle.metadata() or {}
                arrays = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118 - not a dict
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(
                f"{str(path)!r} must be a readable safetensors file, but reading it failed ({err}). {fix}"
            ) from err
        cls._check_arrays(path, metadata, arrays, fix)
        index = CorpusIndex(arrays["tokens"], arrays["offsets"], arrays["suffix_array"])
        if not index.spot_check():
            raise ValueError(
                f"{str(path)!r} must be a corpus written by `save_corpus`, but its `suffix_array` is not sorted. {fix}"
            )
        return index, int(metadata["vocab_size"]) if "vocab_size" in metadata else None

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The settings as `params`; the corpus is **always** stored in the pool, at ``corpus/<name>/`` (a corpus has
        no source to reference). The online store is not saved.

        Ranges of `params` in a pool file (the constructor's, plus the upper bounds `POOL_MAXIMA` that `validate_spec`
        checks): ``max_match_length`` in [1, 1024], ``min_match_length`` in [1, ``max_match_length``],
        ``max_occurrences`` in [1, 4096], ``min_frequency`` in [0, 1], ``online_tokens`` in [0, 10,000,000] (about
        160 MB held), ``vocab_size`` null or in [1, 2**31]."""
        from ..pool.config import DrafterSpec

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
            index, saved_vocab_size = cls._read_corpus(folder)
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
        from ..pool.config import check_at_most

        for key, high in POOL_MAXIMA.items():
            check_at_most(spec.params.get(key), f"{where} `params.{key}`", high)
        if not spec.stored or not spec.path:
            raise InvalidPoolError(
                f'{where} must be stored in the pool (`stored: true` and a `path` such as "corpus/{spec.name}"), but '
                f"has stored={spec.stored!r}, path={spec.path!r}. Re-save the pool with `DrafterPool.save_pretrained`."
            )
        super().validate_spec(spec, where)

    @staticmethod
    def _check_arrays(path: Path, metadata: dict[str, str], arrays: dict[str, np.ndarray], fix: str) -> None:
        """Cheap consistency checks of a loaded corpus file (a full sortedness check would cost a rebuild)."""

        def bad(what: str) -> ValueError:
            return ValueError(f"{str(path)!r} must be a corpus written by `save_corpus`, but {what}. {fix}")

        if metadata.get("format") != "hf_metasd.corpus":
            raise bad(f"its metadata format is {metadata.get('format')!r}")
        if metadata.get("version") != FORMAT_VERSION:
            raise bad(f"its version is {metadata.get('version')!r} (this hf_metasd reads {FORMAT_VERSION!r})")
        expected = {"tokens": np.int32, "offsets": np.int64, "suffix_array": np.int32}
        for key, dtype in expected.items():
            if key not in arrays or arrays[key].dtype != dtype or arrays[key].ndim != 1:
                found = arrays.get(key)
                raise bad(
                    f"`{key}` is {None if found is None else (found.dtype, found.shape)}, not 1-D {dtype.__name__}"
                )
        tokens, offsets, sa = arrays["tokens"], arrays["offsets"], arrays["suffix_array"]
        if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
            raise bad("its `offsets` are not the non-decreasing document starts from 0 to len(tokens)")
        n = len(tokens) + len(offsets) - 1
        if len(sa) != n or (n and (sa.min() < 0 or sa.max() >= n or np.bincount(sa, minlength=n).max() != 1)):
            raise bad(f"its `suffix_array` is not a permutation of range({n})")
        if len(tokens) and (tokens.min() < 0):
            raise bad("its `tokens` hold negative ids")

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

    def spawn(self, target: Any = None) -> CorpusDrafter:
        """The call's copy: it shares the static index and the online store, has fresh telemetry, and keeps the
        target's logits width to apply its logits processors to drafts."""
        clone = super().spawn(target)
        clone._logits_width = self._vocab_size if target is None else target_vocab_size(target)
        return clone

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

    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, None]:
        """Propose up to `num_tokens` tokens after `input_ids` ``(1, L)``: ``(tokens (1, n), None)``, ``n`` may be 0."""
        if num_tokens < 1:
            context: Any = []
        elif self.context_lookup:
            context = input_ids[0].detach().cpu().numpy()
        else:
            context = input_ids[0, -self.max_match_length :].tolist()
        proposal = self.propose(context, num_tokens)
        if not proposal:
            return input_ids[:, :0], None
        tokens = torch.from_numpy(np.array(proposal, dtype=np.int64)).to(
            device=input_ids.device, dtype=input_ids.dtype
        )
        if logits_processor is not None and len(logits_processor) > 0:
            if self._logits_width is None:
                warnings.warn(
                    f"drafter {self.name!r} cannot apply the logits processors to its drafts without the target's "
                    "logits width; it proposes them uncut (still lossless: the target verifies every token). "
                    "Draft with `drafter.spawn(target)` (as `generate` does), or pass `vocab_size=`.",
                    stacklevel=2,
                )
            else:
                allowed = logits_processor_filter(logits_processor, self._logits_width)(input_ids, tokens)
                bad = (~allowed).nonzero()
                if bad.numel():
                    tokens = tokens[: int(bad[0, 0])]
        return tokens.reshape(1, -1), None

    def __repr__(self) -> str:
        return (
            f"CorpusDrafter(name={self.name!r}, documents={self.index.num_documents}, tokens={self.index.num_tokens}, "
            f"online_tokens={self.online_tokens})"
        )
