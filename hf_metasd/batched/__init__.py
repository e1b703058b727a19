"""Batched MetaSD: `input_ids` of shape ``(B, L)``, left padding, an `attention_mask`; a drafter per row.

Rows are different requests. Each row has its own candidate generator (its policy picks its own arm from its own
rewards, its own drafter copies), and every round **one** target forward pass verifies the candidates of every row
that still decodes; each row accepts its own number of tokens. The output is plain batched `generate`'s: every row's
greedy tokens identical, stopping per row exactly where plain stops it (finished rows padded as plain pads them),
sampling per row from the target's distribution.

**Ragged rows on one cache: masked slots.** transformers' caches hold one length for the whole batch. Two ways make
rows that accept different numbers of tokens share one: move cache entries to re-align the rows after every round
(a copy of every layer's keys and values, per round), or let every row advance by the same number of slots and mask
out the slots a row did not keep. This package does the second (`hf_metasd.batched.slots`): no cache entry ever
moves, the attention mask and the position ids (which follow the mask, as plain `generate`'s do for left padding) say
which slots each row sees, the last slots no row kept are cropped after each pass, and rows that need no more tokens
are dropped from the cache. The price is memory: per pass a row wastes at most ``max_b kept_b - kept_row`` slots (at
most the draft length), counted per row in `MetaSDBatchStats.wasted_slots`. It needs full-attention layers (a sliding
window counts slots, not tokens; a recurrent state cannot skip a slot).

**Plain rounds, never a refusal** (`hf_metasd.batched.plain`): what plain batched `generate` runs, a batch runs. Where
rows cannot draft (other cache layers, per-step outputs such as `output_scores`, a cache passed in, a tensor-parallel
target, model inputs other than `attention_mask` and `token_type_ids`), every round is a plain round: the call runs
plain `generate`'s own loop, and `MetaSDBatchStats.plain_reason` says why. `token_type_ids` are fed like the mask
(each later token takes its row's last type, as plain extends them); a row whose mask keeps no token makes the prefill
round plain.

**Drafters.** Every drafter drafts per row, with the row's own copy (`Drafter.spawn`: a model drafter's own KV
cache, a feature head's own cache), and the no-draft arm verifies only the row's own next token. Drafting is not
batched across rows (a row's draft continues its own cache, of its own length); only MetaSD settings a batch cannot
apply are refused before any compute (`check_batch`: a `Policy` object, `meta_skinny_gemm=True`). White-box drafters (`FeatureHeadDrafter`) read the target's
features: the shared pass records them (`FeatureRecorder`), and each row's generator is handed those of the
positions of its own that it kept, as the single-request loop hands them (`hf_metasd.decoding`).

**Draft lengths follow the batch's pass cost** (`hf_metasd.batched.lengths`): the passes are measured by their
total width (rows x columns), each row's draft length is chosen with its share of a pass of that many rows, and each
row's clock is charged its share, so that rows fall back to short drafts or to no draft once verifying more tokens
costs more than they bring.

Modules: `steps` (plain `generate`'s step-wise stopping over rows that run ahead of each other), `slots` (the
cache's mask and positions), `processors` (the logits processors over the whole batch, as plain runs them),
`lengths` (the passes' costs, each row's share), `loop` (the rounds), `plain` (what rows cannot draft with, and plain
rounds for it), `telemetry` (`MetaSDBatchStats`), `call` (checks, one generator per row).
"""

from .call import batch_key, check_batch, generate_batch
from .plain import plain_reason
from .telemetry import MetaSDBatchStats

__all__ = ["MetaSDBatchStats", "batch_key", "check_batch", "generate_batch", "plain_reason"]
