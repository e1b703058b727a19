"""Re-tokenisation: the bridge between two tokenizers, as pure functions over text and ids.

A drafter with its own tokenizer (`hf_metasd.drafters.other_tokenizer.TokenizerBridgeDrafter`) drafts text; these
functions turn that text into target token ids that continue the target's sequence exactly (`continuation_ids`), say
which special tokens a tokenizer puts before a text (`leading_special_ids`), and how many own tokens to draft for a
number of target tokens (`draft_steps`).

**Re-tokenisation rules** (`continuation_ids`: ``W`` is the last `lookbehind` target tokens, ``C`` their text):

1. ``X`` ending in an incomplete character (U+FFFD, a partial byte sequence) is cut before it. An empty ``X``, or a
   ``C`` ending in U+FFFD (the target stopped inside a character), maps to nothing.
2. *exact*: ``C`` and ``C + X`` are encoded with the target tokenizer (no special tokens added). When the first is a
   prefix of the second, the rest is the continuation. The comparison is with the re-encoding of ``C``, not with
   ``W`` itself, so that how the window begins (mid-word, a tokenizer that prepends a space marker) or an earlier
   non-canonical target token does not matter: both encodings begin alike, only their ends are compared. When the
   encodings differ but ``C + X``'s has a token boundary exactly at the end of ``C``, the tokens after it are the
   continuation too.
3. *bridged*: otherwise ``X`` re-segments the end of ``C``: the target's last token is ``"hel"``, ``X = "lo there"``,
   and the re-encoding holds ``"hello"``, which the target, already holding ``"hel"``, cannot produce. The **safe
   choice**: keep the re-encoding's tokens from its first boundary past the end of ``C`` (``" there"``), and encode
   the straddled piece of ``X`` (``"lo"``) on its own in front of them.
4. Every continuation is checked: ``decode(W + candidates)`` must be exactly ``C + X``, or nothing is proposed
   (*none*). So a bridge that a tokenizer spells differently (one that prepends a space marker to every encoding
   makes ``"lo"`` read ``" lo"``) abstains, and so does a target tokenizer whose ``decode(encode(text))`` is not
   ``text`` (a normalising one): the candidates always spell the drafter's text.
5. The last candidate is dropped unless the drafter's text ended (it drafted one of its special tokens): the drafter
   may have been inside a word, which its next token would have re-segmented.

Why not transformers' own conversion: see the drafter's module docstring (its helper decodes with
``clean_up_tokenization_spaces=True``, which changes the text, and aligns the windows on a heuristic diagonal; the
rules above compare exact text boundaries instead).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_LOOKBEHIND",
    "MAX_STEPS_PER_TOKEN",
    "Continuation",
    "check_tokenizer",
    "continuation_ids",
    "decode_ids",
    "draft_steps",
    "encode_text",
    "leading_special_ids",
]

#: Target tokens re-read around the boundary (`GenerationConfig`'s default ``target_lookbehind``).
DEFAULT_LOOKBEHIND = 10
#: Most own tokens drafted per target token asked for (bounds `draft_steps` for a much finer drafter tokenizer).
MAX_STEPS_PER_TOKEN = 4
_REPLACEMENT = "\ufffd"


def decode_ids(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    """The text of `ids`, exactly as the tokenizer spells it (no clean-up of spaces)."""
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The ids of `text`, without special tokens."""
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Continuation(NamedTuple):
    """What `continuation_ids` made of a text: the target ids and the rule that produced them.

    Attributes:
        token_ids: target ids continuing the context (after the trailing drop of rule 5).
        rule: ``"exact"``, ``"bridged"`` or ``"none"`` (rules 2-4 of the module docstring).
    """

    token_ids: list[int]
    rule: str


def continuation_ids(
    tokenizer: Any,
    context_ids: Sequence[int],
    text: str,
    *,
    lookbehind: int = DEFAULT_LOOKBEHIND,
    complete: bool = False,
) -> Continuation:
    """Target ids that continue `context_ids` with `text`, by the re-tokenisation rules of the module docstring.

    Args:
        tokenizer: the target's tokenizer.
        context_ids: the target's sequence (only its last `lookbehind` ids are read).
        text: the new text (the drafter's decoded draft).
        lookbehind: target tokens re-read around the boundary.
        complete: the text ended (the drafter drafted an end token): keep the last candidate (rule 5).

    Example:
        >>> from tokenizers import Tokenizer, decoders, models
        >>> from transformers import PreTrainedTokenizerFast
        >>> chars = {c: i for i, c in enumerate("abcdehlorst ")}
        >>> merges = [("h", "e"), ("he", "l"), ("hel", "l"), ("hell", "o")]
        >>> bpe = Tokenizer(models.BPE({**chars, "he": 12, "hel": 13, "hell": 14, "hello": 15}, merges))
        >>> bpe.decoder = decoders.Fuse()
        >>> target = PreTrainedTokenizerFast(tokenizer_object=bpe)
        >>> context = target.encode("a hel")                            # ..., "hel"
        >>> ids, rule = continuation_ids(target, context, "lo there", complete=True)
        >>> rule, target.convert_ids_to_tokens(ids)                      # "lo" bridged before " there"
        ('bridged', ['l', 'o', ' ', 't', 'he', 'r', 'e'])
        >>> continuation_ids(target, context, "lo there").token_ids == ids[:-1]   # incomplete: last one dropped
        True
    """
    text = text.rstrip(_REPLACEMENT)
    if not text:
        return Continuation([], "none")
    window = [int(i) for i in list(context_ids)[-lookbehind:]] if lookbehind > 0 else []
    window_text = decode_ids(tokenizer, window)
    if window_text.endswith(_REPLACEMENT):
        return Continuation([], "none")
    base = encode_text(tokenizer, window_text)
    full = encode_text(tokenizer, window_text + text)
    if full[: len(base)] == base:
        ids, rule = full[len(base) :], "exact"
    else:
        ids, rule = _across_boundary(tokenizer, window_text, text, full, _common_prefix(base, full))
    if ids and decode_ids(tokenizer, window + ids) != window_text + text:
        return Continuation([], "none")
    if not complete:
        ids = ids[:-1]
    return Continuation(ids, rule)


def _across_boundary(tokenizer: Any, context: str, text: str, full: list[int], start: int) -> tuple[list[int], str]:
    """Rules 2-3 when the re-encoding of ``context + text`` changed the end of ``context``'s: find its first token
    boundary at or past the end of `context`; bridge the straddled piece of `text` by encoding it on its own."""
    whole = context + text
    for j in range(start, len(full) + 1):
        decoded = decode_ids(tokenizer, full[:j])
        if len(decoded) >= len(context) and whole.startswith(decoded):  # a partial character never matches
            piece = decoded[len(context) :]
            if not piece:
                return full[j:], "exact"
            return encode_text(tokenizer, piece) + full[j:], "bridged"
    return [], "none"


def leading_special_ids(tokenizer: Any) -> list[int]:
    """The special ids `tokenizer` puts **before** a text when it adds special tokens (e.g. ``[bos]``; none after).

    Example:
        >>> from tokenizers import Tokenizer, models, processors
        >>> from transformers import PreTrainedTokenizerFast
        >>> raw = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "a": 2}, unk_token="<s>"))
        >>> raw.post_processor = processors.TemplateProcessing(
        ...     single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
        >>> tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="</s>")
        >>> tok.encode("a"), leading_special_ids(tok)
        ([0, 2, 1], [0])
    """
    plain = encode_text(tokenizer, "a")
    marked = [int(i) for i in tokenizer.encode("a", add_special_tokens=True)]
    for start in range(len(marked) - len(plain) + 1):
        if marked[start : start + len(plain)] == plain:
            return marked[:start]
    return []


def draft_steps(num_tokens: int, own_length: int, target_length: int) -> int:
    """Own tokens to draft for `num_tokens` target tokens: ``ceil((num_tokens + 1) * own_length / target_length)``,
    in ``[1, MAX_STEPS_PER_TOKEN * (num_tokens + 1)]`` (one target token more than proposed: rule 5 drops one).

    Example:
        >>> draft_steps(3, 50, 100), draft_steps(3, 100, 100), draft_steps(3, 1000, 10)  # coarser, same, finer
        (2, 4, 16)
    """
    ratio = own_length / max(target_length, 1)
    return max(1, min(math.ceil((num_tokens + 1) * ratio), MAX_STEPS_PER_TOKEN * (num_tokens + 1)))


def check_tokenizer(name: str, tokenizer: Any) -> None:
    """A `TypeError` naming `name` unless `tokenizer` has what re-tokenisation calls (a transformers tokenizer)."""
    if not all(callable(getattr(tokenizer, attr, None)) for attr in ("encode", "decode", "get_vocab", "__len__")):
        raise TypeError(
            f"`{name}` must be a transformers tokenizer (`encode`, `decode`, `get_vocab`), but is "
            f"{type(tokenizer).__name__}. Pass e.g. `AutoTokenizer.from_pretrained(model_id)`."
        )
