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
window counts slots, not tokens; a recurrent state cannot skip a slot): other targets are refused at B > 1.

**Drafters.** Model-free drafters (prompt lookup, corpus) draft per row, and the no-draft arm verifies only the row's
own next token. Drafters with a model keep one KV cache per sequence; they do not draft batched yet and are refused
at B > 1 (before any compute), as are what a batch cannot return as plain does (`check_batch`).

Modules: `steps` (plain `generate`'s step-wise stopping over rows that run ahead of each other), `slots` (the
cache's mask and positions), `processors` (the logits processors over the whole batch, as plain runs them), `loop`
(the rounds), `telemetry` (`MetaSDBatchStats`), `call` (checks, one generator per row).
"""

from .call import batch_key, check_batch, generate_batch
from .telemetry import MetaSDBatchStats

__all__ = ["MetaSDBatchStats", "batch_key", "check_batch", "generate_batch"]
