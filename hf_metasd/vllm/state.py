"""Per-request state of the vLLM proposer, and how each row of a `propose` call is matched to its request.

vLLM calls the proposer once per engine step with one row per running request (``sampled_token_ids[i]``,
``num_tokens_no_spec[i]``, ``token_ids_cpu[i]``), in the order of its persistent batch, and passes **no request ids**:
rows move when requests finish (vLLM condenses the batch, moving the last rows into the holes), new requests join at
free rows, and an unscheduled request leaves the batch for a while. `RequestTable` therefore recognises a request by
its token history.

**The rule.** At a call, row ``i`` holds ``L = num_tokens_no_spec[i]`` tokens ``x = token_ids_cpu[i, :L]``, the last
``s = len(sampled_token_ids[i])`` of which were appended by the step that just ran: the ``s - 1`` draft tokens the
target accepted, then the token it sampled itself. A state ``r`` kept from an earlier call, with history ``h_r``
(that call's tokens of its row) and draft ``d_r`` (what the proposer returned for it), is a *candidate* for row
``i`` iff

* ``len(h_r) == L - s`` and ``h_r == x[:L - s]`` (the previous tokens of this row are exactly ``r``'s), and
* ``x[L - s : L - 1] == d_r[:s - 1]`` (the accepted tokens are a prefix of ``r``'s draft, as vLLM's verification makes
  them; so ``s - 1 <= len(d_r)``).

The accepted count of ``r``'s draft is then ``s - 1``. A row with no candidate is a new request (fresh state); a row
with ``s = 0`` (a chunk of a prefill, or a discarded sample) drafts nothing and leaves every state untouched.

**Several candidates.** Only requests whose histories are token-for-token identical (the same prompt and the same
output so far, e.g. ``n > 1`` greedy completions of one prompt) can be candidates of the same row. Rows are assigned
most constrained first (fewest candidates; the candidate sets are nested or disjoint, so this finds a full
assignment whenever one exists), and a row takes, among its free candidates, the state that sat at the same row index
in its last call (a row keeps its index unless an earlier row finished), else the oldest. Where the accepted tokens do
not tell two identical requests apart, their states may swap: that is the only way two requests' states can be
exchanged, only between requests whose every token so far is the same, and each row still gets one whole state,
never a blend (the model-free arms draft from the history alone, so the drafts on offer are the same for both rows;
only which learnt values go with which row can change).

**Limits.** A step in which vLLM verified a request's draft but did not call the proposer (its input did not fit the
drafter, or it was preempted and recomputed) breaks the length rule: the request then continues with a fresh state.
A new request whose prompt is exactly the last history of a finished (or absent) request, and whose first sampled
token follows it, is indistinguishable from that request going on, and takes its state over. States not seen for a
while stay (an unscheduled request comes back with its state); the table keeps at most `capacity` of them, dropping
the least recently seen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["RequestState", "RequestTable"]


@dataclass(eq=False)
class RequestState:
    """What the proposer keeps about one request between its calls.

    Attributes:
        policy: the request's own policy (its learnt values never leave it).
        history: ``(L,)`` the request's tokens at the last call that saw it (``token_ids_cpu[row, :L]``, copied).
        row: the row index it had in that call.
        call: the number of that call (the proposer counts its calls from 1).
        arm: the arm whose round awaits its outcome (the arm of `draft`, or the no-draft arm), ``None`` when there is
            nothing to learn from the next call.
        draft: the tokens proposed for it at that call (empty for the no-draft arm).
        created: a serial number (older states win ties).
    """

    policy: Any
    history: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    row: int = -1
    call: int = 0
    arm: int | None = None
    draft: list[int] = field(default_factory=list)
    created: int = 0


class RequestTable:
    """The states of the requests the proposer has seen, matched to the rows of each call (see the module docstring).

    Args:
        capacity: most states kept; beyond it the least recently seen are dropped.

    Example:
        >>> import numpy as np
        >>> table = RequestTable(capacity=8)
        >>> tokens = np.zeros((4, 16), dtype=np.int32)
        >>> tokens[0, :5] = [1, 2, 3, 4, 5]; tokens[1, :4] = [7, 8, 9, 6]
        >>> a, b = RequestState(policy="A"), RequestState(policy="B")
        >>> table.store(a, tokens[0, :5], row=0, call=1, draft=[6, 7])   # request A drafted [6, 7] after 5 tokens
        >>> table.store(b, tokens[1, :4], row=1, call=1, draft=[])
        >>> # the next step: B moved to row 0 and sampled 5; A, now at row 1, accepted 6 of its draft, then sampled 9
        >>> tokens[0, :5] = [7, 8, 9, 6, 5]; tokens[1, :8] = [1, 2, 3, 4, 5, 6, 9, 0]
        >>> [s.policy for s in table.match([[5], [6, 9]], np.array([5, 7]), tokens)]
        ['B', 'A']
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._states: list[RequestState] = []
        self._serial = 0

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[RequestState]:
        """The states kept (not those a `match` took out until `store` puts them back)."""
        return iter(list(self._states))

    def new(self, policy: Any) -> RequestState:
        """A fresh state for a new request (stored by `store`)."""
        self._serial += 1
        return RequestState(policy=policy, created=self._serial)

    def store(
        self, state: RequestState, history: np.ndarray, *, row: int, call: int, draft: Sequence[int] | None = None
    ) -> None:
        """Record what `state`'s request looked like at call `call`: its tokens `history` (copied), its `row` and, if
        given, its `draft`; a state not in the table yet is added."""
        state.history = np.array(history, dtype=np.int32, copy=True)
        state.row, state.call = row, call
        if draft is not None:
            state.draft = list(draft)
        if not any(s is state for s in self._states):
            self._states.append(state)

    def match(
        self, sampled_token_ids: Sequence[Sequence[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray
    ) -> list[RequestState | None]:
        """Each row's state (``None``: a new request, or a row with nothing sampled), by the rule of the module
        docstring. Matched states are taken out of the table until `store` puts them back."""
        by_length: dict[int, list[RequestState]] = defaultdict(list)
        for state in self._states:
            by_length[state.history.shape[0]].append(state)
        candidates: dict[int, list[RequestState]] = {}
        for i, sampled in enumerate(sampled_token_ids):
            if len(sampled) == 0:
                continue
            start = int(num_tokens_no_spec[i]) - len(sampled)
            accepted = list(sampled[:-1])
            row = token_ids_cpu[i]
            found = [
                s
                for s in by_length.get(start, ())
                if s.draft[: len(accepted)] == accepted
                and len(accepted) <= len(s.draft)
                and (start == 0 or s.history[-1] == row[start - 1])  # cheap first, then the whole history
                and np.array_equal(s.history, row[:start])
            ]
            if found:
                candidates[i] = sorted(found, key=lambda s: s.created)
        out: list[RequestState | None] = [None] * len(sampled_token_ids)
        taken: set[int] = set()
        for i in sorted(candidates, key=lambda i: (len(candidates[i]), i)):
            free = [s for s in candidates[i] if id(s) not in taken]
            if not free:
                continue
            chosen = next((s for s in free if s.row == i), free[0])
            taken.add(id(chosen))
            out[i] = chosen
        if taken:
            self._states = [s for s in self._states if id(s) not in taken]
        return out

    def evict(self) -> None:
        """Drop the least recently seen states beyond `capacity`."""
        if len(self._states) > self.capacity:
            self._states.sort(key=lambda s: (s.call, s.created))
            del self._states[: len(self._states) - self.capacity]
