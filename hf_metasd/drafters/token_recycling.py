"""Token recycling drafter: model-free drafting from what the target's own verification passes predicted.

Every verification pass computes the target's next-token scores after each token it verifies, the accepted ones and
the rejected ones alike; plain speculative decoding throws all but one of them away. Token Recycling (Luo et al.,
*Turning Trash into Treasure*, ACL 2025) keeps them: an adjacency table holds, for each token :math:`x`, the target's
top-`top_k` next tokens from the latest pass that scored a position holding :math:`x`, and a draft walks it. This
drafter keeps the most likely of them per token (a chain: trees need wide passes, which a CPU does not make cheap)
and drafts

.. math::

    y_1 = T[x_L], \\quad y_{j+1} = T[y_j], \\qquad j < n,

from the context's last token :math:`x_L`, stopping at a token the table does not hold (it abstains when
:math:`x_L` is not held). After each round the call hands it the pass's scores (`observe_scores`): for the ``n + 1``
positions of a pass over the last kept token and ``n`` drafted ones, :math:`T[\\text{token}_i] \\leftarrow
\\arg\\max_v s_{i, v}`. It needs no training and no model; the table costs a few bytes per distinct token seen.

**Shared across calls, thread-safe, per scope.** The table belongs to the pool's drafter, not to a call: every
`spawn` copy reads and updates the same table under one lock, so later calls (and concurrent ones) start from what
earlier passes taught. Like learned priors and acceptance rates, what calls teach it is kept per
`hf_metasd.reward_memory_scope`: the default scope learns into the drafter's own table (the one a pool saves), and
each named scope into its own copy of it, made on first use (a benchmark's methods, each in its scope, do not read
the answers another method's calls taught the table); an `hf_metasd.reward_memory.IsolatedScope` (a reproducible
call's) copies the table as it was built (stored in the pool, or filled by `warm_start`), not what calls taught it. `warm_start` fills it before any call from the target's scores over sequences (its answers to training
prompts), and a pool saves it (``recycling/<name>/table.safetensors``: two int32 arrays, at most `MAX_ROWS` rows),
read back as data under the pool's untrusted-data rules (no code, nothing outside the pool's folder, every id
bounded).

**Lossless** like every arm: it proposes ids without logits (a `CandidateDrafter`), the target verifies every one,
and the call's logits processors cut a proposal where they forbid a token.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from .._validation import check_int
from ..errors import DrafterCompatibilityError, InvalidPoolError
from ..reward_memory import IsolatedScope, current_scope
from .base import Drafter, int_error
from .candidates import CandidateDrafter, IsAllowed, allowed_prefix
from .load import LoadContext
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import DrafterSpec
from .vocab import target_vocab_size

__all__ = ["RecyclingTable", "TokenRecyclingDrafter"]

#: The file a pool stores a table in (under ``recycling/<name>/``).
TABLE_FILE = "table.safetensors"
#: Most rows a stored table may hold (one per distinct token; 2**18 rows are 2 MB).
MAX_ROWS = 1 << 18
#: Largest token id a stored table may hold.
MAX_TOKEN_ID = (1 << 31) - 1


class RecyclingTable:
    """token -> the target's most likely next token after it, from the latest pass that scored it; thread-safe.

    Example:
        >>> table = RecyclingTable()
        >>> table.learn([5, 6], [6, 9])       # a pass scored 6 most likely after 5, and 9 after 6
        >>> table.walk(5, 3), table.walk(7, 3), len(table)
        ([6, 9], [], 2)
    """

    def __init__(self, rows: dict[int, int] | None = None) -> None:
        self._next: dict[int, int] = dict(rows or {})
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._next)

    def learn(self, tokens: Sequence[int], next_tokens: Sequence[int]) -> None:
        """``T[tokens[i]] = next_tokens[i]`` for every i, in order (a later position overwrites an earlier one)."""
        with self._lock:
            for token, following in zip(tokens, next_tokens, strict=True):
                self._next[int(token)] = int(following)

    def walk(self, token: int, num_tokens: int) -> list[int]:
        """Up to `num_tokens` tokens following `token` through the table (stops at a token it does not hold)."""
        out: list[int] = []
        with self._lock:
            get = self._next.get
            following = get(int(token))
            while following is not None and len(out) < num_tokens:
                out.append(following)
                following = get(following)
        return out

    def copy(self) -> RecyclingTable:
        """A table of the same rows, learning apart from this one."""
        with self._lock:
            return RecyclingTable(self._next)

    def rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens, next_tokens)``: two ``(R,)`` int32 tensors, sorted by token (what a pool stores)."""
        with self._lock:
            items = sorted(self._next.items())
        if not items:
            return torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.int32)
        tokens, following = zip(*items, strict=True)
        return torch.tensor(tokens, dtype=torch.int32), torch.tensor(following, dtype=torch.int32)

    @property
    def max_token_id(self) -> int:
        """The largest id the table holds (-1 when empty)."""
        with self._lock:
            return max((max(k, v) for k, v in self._next.items()), default=-1)


@register_drafter_kind
class TokenRecyclingDrafter(CandidateDrafter):
    """Drafts by walking a table of the target's own most likely next tokens (see the module docstring).

    Args:
        name: label (default ``"token_recycling"``).
        table: a `RecyclingTable` to start from (default: empty); it is shared, not copied.

    Example:
        >>> import torch
        >>> drafter = TokenRecyclingDrafter()
        >>> scores = torch.zeros(1, 2, 10); scores[0, 0, 7] = 1.0; scores[0, 1, 8] = 1.0
        >>> drafter.observe_scores(torch.tensor([[3, 7]]), scores)   # after 3 the target favours 7, after 7: 8
        >>> drafter.draft(torch.tensor([[1, 3]]), 4)
        (tensor([[7, 8]]), None)
    """

    kind = "token_recycling"
    learns_from_scores = True
    #: Replayable: a round's replayed proposal is made before the table learns from that round's pass.
    replayable = True

    def __init__(self, *, name: str | None = None, table: RecyclingTable | None = None) -> None:
        super().__init__(name)
        self.table = RecyclingTable() if table is None else table

    @property
    def table(self) -> RecyclingTable:
        """The table of the `hf_metasd.reward_memory_scope` in force: the drafter's own in the default scope, else
        that scope's copy of it (made on first use)."""
        scope = current_scope()
        if scope is None:
            return self._table
        with self._scopes_lock:
            found = self._scopes.get(scope)
            if found is None:  # an isolated scope starts from the table as built, not from what calls taught it
                found = self._scopes[scope] = (self._built if isinstance(scope, IsolatedScope) else self._table).copy()
            return found

    @table.setter
    def table(self, table: RecyclingTable) -> None:
        if not isinstance(table, RecyclingTable):
            raise TypeError(
                f"`table` must be a `RecyclingTable` or None, but is {type(table).__name__}. Build one with "
                "`RecyclingTable()`, or leave it out."
            )
        self._table = table
        self._built = table.copy()  # the table as given (a pool's stored one, or empty), for isolated scopes
        self._scopes: dict[Hashable, RecyclingTable] = {}  # shared by `spawn` copies (never reassigned by `reset`)
        self._scopes_lock = threading.Lock()

    # ------------------------------------------------------------------ learning
    def observe_scores(self, tokens: torch.LongTensor, scores: torch.Tensor) -> None:
        """Learn from one verification pass: `scores` ``(1, k, V)`` are the target's (processed) scores after each of
        the `tokens` ``(1, k)`` it was fed (the last kept token, then the drafted ones, accepted or not)."""
        if tokens.shape[-1] == 0:
            return
        best = scores[0, : tokens.shape[-1]].argmax(dim=-1)
        self.table.learn(tokens[0].tolist(), best.tolist())

    @torch.no_grad()
    def warm_start(self, target: Any, sequences: Iterable[Sequence[int]], *, chunk: int = 1024) -> int:
        """Fill the table from the target's greedy next token after every position of each of `sequences` (token id
        lists, e.g. its own answers to training prompts with their prompts), one teacher-forced pass per chunk of
        `chunk` tokens. Returns the number of positions read.

        Example:
            >>> import torch
            >>> from transformers import LlamaConfig, LlamaForCausalLM
            >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            ...                   num_attention_heads=2, num_key_value_heads=1)
            >>> _ = torch.manual_seed(0)
            >>> drafter = TokenRecyclingDrafter()
            >>> drafter.warm_start(LlamaForCausalLM(cfg).eval(), [[1, 2, 3, 4]]), len(drafter.table) > 0
            (4, True)
        """
        check_int("chunk", chunk, low=1, hint="Use e.g. 1024.", error=int_error(chunk))
        read = 0
        for sequence in sequences:
            ids = [int(t) for t in sequence]
            for start in range(0, len(ids), chunk):
                part = ids[start : start + chunk]
                logits = target(torch.tensor([part], device=target.device), use_cache=False).logits
                following = logits[0].argmax(dim=-1).tolist()
                self.table.learn(part, following)
                if current_scope() is None:  # the default scope's warm start is part of the table as built
                    self._built.learn(part, following)
                read += len(part)
        return read

    # ------------------------------------------------------------------ drafting
    def candidates(self, input_ids: torch.LongTensor, num_tokens: int, is_allowed: IsAllowed | None) -> torch.Tensor:
        """The table's walk from the context's last token, cut where `is_allowed` forbids a token."""
        walk = self.table.walk(int(input_ids[0, -1]), num_tokens)
        proposal = torch.tensor(walk, dtype=input_ids.dtype, device=input_ids.device)
        return allowed_prefix(proposal, input_ids, is_allowed)

    def check_compatible(self, target: Any) -> None:
        """Every id the table holds must be in the target's vocabulary."""
        super().check_compatible(target)
        width = target_vocab_size(target)
        if self.table.max_token_id >= width:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must hold token ids below the target's vocabulary size {width}, but its table "
                f"holds id {self.table.max_token_id}. Warm it with the target's own tokens, or start it empty."
            )

    # ------------------------------------------------------------------ pool config round trip
    def save_table(self, folder: str | Path) -> Path:
        """Write the table to ``folder/table.safetensors`` (two int32 arrays); returns the file's path."""
        from safetensors.torch import save_file

        path = Path(folder)
        path.mkdir(parents=True, exist_ok=True)
        tokens, following = self.table.rows()
        save_file({"tokens": tokens, "next_tokens": following}, str(path / TABLE_FILE), metadata={"format": "1"})
        return path / TABLE_FILE

    @staticmethod
    def read_table(folder: str | Path) -> RecyclingTable:
        """The table of ``folder/table.safetensors``, checked as untrusted data: two 1-D int32 arrays of one length
        (at most `MAX_ROWS`), ids in ``[0, MAX_TOKEN_ID]``, each token once.

        Raises:
            FileNotFoundError: no such file.
            ValueError: anything else in it.
        """
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(folder) / TABLE_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no {TABLE_FILE} in {str(folder)!r}")
        try:
            arrays = load_file(str(path))
        except (SafetensorError, OSError) as err:
            raise ValueError(f"{str(path)!r} is not a readable safetensors file ({err})") from err
        if set(arrays) != {"tokens", "next_tokens"}:
            raise ValueError(f"{str(path)!r} must hold `tokens` and `next_tokens`, but holds {sorted(arrays)}")
        tokens, following = arrays["tokens"], arrays["next_tokens"]
        for key, array in (("tokens", tokens), ("next_tokens", following)):
            if array.dtype != torch.int32 or array.dim() != 1:
                raise ValueError(
                    f"`{key}` must be a 1-D int32 array, but is {array.dtype} of shape {list(array.shape)}"
                )
        if tokens.shape != following.shape or tokens.shape[0] > MAX_ROWS:
            raise ValueError(
                f"`tokens` and `next_tokens` must have one length of at most {MAX_ROWS}, but have "
                f"{tokens.shape[0]} and {following.shape[0]}"
            )
        if tokens.numel() and (int(tokens.min()) < 0 or int(following.min()) < 0):
            raise ValueError("every id must be >= 0, but the table holds a negative one")
        if tokens.unique().numel() != tokens.numel():
            raise ValueError("`tokens` must hold each token once, but repeats some")
        return RecyclingTable(dict(zip(tokens.tolist(), following.tolist(), strict=True)))

    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The table is stored in the pool at ``recycling/<name>/`` (what earlier calls and `warm_start` taught it);
        no parameters."""
        (drafter,) = group
        folder = ctx.folder("recycling", drafter.name)
        ctx.schedule(lambda root: drafter.save_table(root / folder))
        return DrafterSpec(cls.kind, drafter.name, path=folder, stored=True, params={})

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The drafter with the table of ``<pool>/<path>/table.safetensors`` (`read_table`)."""
        where = ctx.where(spec)
        folder = Path(ctx.resolve(spec, where, need_folder=True))
        try:
            table = cls.read_table(folder)
        except (FileNotFoundError, ValueError) as err:
            raise InvalidPoolError(
                f"{where} must find a readable table at {str(folder / TABLE_FILE)!r}, but it cannot be read: {err}. "
                "Restore the file, or re-save the pool from a working copy of the drafter."
            ) from err
        return [ctx.build(spec, cls, lambda: cls(name=spec.name, table=table))]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A recycling entry is stored in the pool (``stored: true`` and a `path`), without `params` or `adapters`."""
        if not spec.stored or not spec.path:
            raise InvalidPoolError(
                f'{where} must be stored in the pool (`stored: true` and a `path` such as "recycling/{spec.name}"), '
                f"but has stored={spec.stored!r}, path={spec.path!r}. Re-save the pool with "
                "`DrafterPool.save_pretrained`."
            )
        if spec.params:
            raise InvalidPoolError(
                f"{where} must have no `params`, but has {sorted(spec.params)}. Drop them (the table is the file)."
            )
        super().validate_spec(spec, where)

    def __repr__(self) -> str:
        return f"TokenRecyclingDrafter(name={self.name!r}, rows={len(self.table)})"
