"""The corpus drafter's index: a suffix array over token documents, its search, and its compact file.

`CorpusIndex` answers one question fast: what is the longest suffix of a context that occurs in a corpus of token
documents, and what followed its occurrences (`hf_metasd.drafters.corpus.CorpusDrafter` drafts from the answer).

**Index.** The documents ``d_1 .. d_k`` are concatenated as ``F = d_1 # d_2 # ... d_k #`` with a separator ``#``
that no context contains, and ``R = reverse(F)`` is stored as big-endian ``uint32`` bytes, so that comparing two
`bytes` slices compares token sequences lexicographically. The suffix array ``SA`` lists the start positions of
``R``'s suffixes in sorted order (built by prefix doubling with numpy, about 1 s per million tokens). A suffix of the
context ``c`` that occurs in the corpus is a prefix of ``reverse(c)`` that starts a suffix of ``R``, so the longest
such match is one binary search: with ``q = reverse(c)[:max_match_length]`` and ``i`` the insertion point of ``q`` in
``SA``, the match length is ``m = max(lcp(q, R[SA[i-1]:]), lcp(q, R[SA[i]:]))``, and the ``s = hi - lo`` suffixes that
share those ``m`` tokens (the *support*) are the range ``[lo, hi)`` found by two more binary searches. A match never
crosses a document (it would have to match ``#``), and a continuation stops at the next ``#``.

**The context** is searched without an index (`context_match`, `context_continuations`): one vectorised scan per
matched token.

**Online store** (`OnlineStore`): a bounded first-in-first-out store of generated documents with its own small index,
rebuilt after each added document (about 1 s per million held tokens), about 16 bytes per held token.

**File** (`write_corpus` / `read_corpus`): ``corpus.safetensors`` holds ``tokens`` (T,) int32, ``offsets`` (k+1,)
int64 document starts and ``suffix_array`` (T+k,) int32, so that loading does not rebuild the index; reading checks
the layout and spot-checks the order.
"""

from __future__ import annotations

import bisect
import struct
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

__all__ = [
    "CORPUS_FILE",
    "MAX_TOKEN_ID",
    "CorpusIndex",
    "OnlineStore",
    "build_suffix_array",
    "context_continuations",
    "context_match",
    "read_corpus",
    "write_corpus",
]

#: file written by `write_corpus` (`CorpusDrafter.save_corpus`).
CORPUS_FILE = "corpus.safetensors"
#: bump when the file layout changes.
FORMAT_VERSION = "1"
#: the document separator in the reversed corpus: above every valid token id (ids are int32), so it never matches.
SEPARATOR = 0xFFFFFFFF
#: the largest token id a corpus holds (ids are int32).
MAX_TOKEN_ID = 2**31 - 1


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
    if low < 0 or high > MAX_TOKEN_ID:
        bad = low if low < 0 else high
        raise ValueError(
            f"`sequences[{i}]` must hold token ids in [0, {MAX_TOKEN_ID}], but holds {bad}. "
            "Pass the target tokenizer's ids (drop padding such as -100)."
        )
    return array.astype(np.int32)


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
        if lengths.sum() + len(documents) > MAX_TOKEN_ID:
            raise ValueError(
                f"`sequences` must hold fewer than {MAX_TOKEN_ID} tokens, but holds {int(lengths.sum())}. "
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


class OnlineStore:
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
# the file
# ---------------------------------------------------------------------------------------------------------------------
def write_corpus(index: CorpusIndex, folder: str | Path, *, vocab_size: int | None = None) -> Path:
    """Write `index` (its documents and suffix array) to ``folder/corpus.safetensors``, with `vocab_size` (when set)
    in the metadata; returns the file's path."""
    path = Path(folder) / CORPUS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    metadata = {"format": "hf_metasd.corpus", "version": FORMAT_VERSION}
    if vocab_size is not None:
        metadata["vocab_size"] = str(vocab_size)
    save_file(index.arrays(), str(path), metadata=metadata)
    return path


def read_corpus(folder: str | Path) -> tuple[CorpusIndex, int | None]:
    """The index stored in ``folder/corpus.safetensors`` by `write_corpus`, and the saved `vocab_size` (or ``None``).

    Raises:
        FileNotFoundError: `folder` holds no ``corpus.safetensors``.
        ValueError: the file is truncated, corrupt, or not a corpus of this format.
    """
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
    _check_arrays(path, metadata, arrays, fix)
    index = CorpusIndex(arrays["tokens"], arrays["offsets"], arrays["suffix_array"])
    if not index.spot_check():
        raise ValueError(
            f"{str(path)!r} must be a corpus written by `save_corpus`, but its `suffix_array` is not sorted. {fix}"
        )
    return index, int(metadata["vocab_size"]) if "vocab_size" in metadata else None


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
            raise bad(f"`{key}` is {None if found is None else (found.dtype, found.shape)}, not 1-D {dtype.__name__}")
    tokens, offsets, sa = arrays["tokens"], arrays["offsets"], arrays["suffix_array"]
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets) < 0):
        raise bad("its `offsets` are not the non-decreasing document starts from 0 to len(tokens)")
    n = len(tokens) + len(offsets) - 1
    if len(sa) != n or (n and (sa.min() < 0 or sa.max() >= n or np.bincount(sa, minlength=n).max() != 1)):
        raise bad(f"its `suffix_array` is not a permutation of range({n})")
    if len(tokens) and (tokens.min() < 0):
        raise bad("its `tokens` hold negative ids")
