"""What identifies a vocabulary: a causal LM's logits width and a tokenizer's fingerprint.

Drafters, their pool entries and the pool itself compare vocabularies with these two functions (a drafter with another
vocabulary than the target's is refused before any compute; a pool records the fingerprint of the tokenizer it was
saved with).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

__all__ = ["target_vocab_size", "tokenizer_fingerprint"]


def target_vocab_size(model: Any) -> int:
    """The logits width of a causal LM (its text config's `vocab_size`)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.vocab_size)


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A fingerprint of a tokenizer's vocabulary: the sha256 of its sorted ``(token, id)`` items.

    Two tokenizers with the same vocabulary *size* but other tokens (or ids) get different fingerprints, which a
    vocabulary-size check cannot tell apart. Anything with transformers' ``get_vocab()`` works.

    Example:
        >>> from tokenizers import Tokenizer, models
        >>> from transformers import PreTrainedTokenizerFast
        >>> def tiny(words):
        ...     vocab = {w: i for i, w in enumerate(["<unk>", *words])}
        ...     return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<unk>")))
        >>> a, b = tokenizer_fingerprint(tiny(["yes", "no"])), tokenizer_fingerprint(tiny(["no", "yes"]))
        >>> len(a), a == tokenizer_fingerprint(tiny(["yes", "no"])), a == b   # same size, other ids: differ
        (64, True, False)
    """
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if not callable(get_vocab):
        raise TypeError(
            f"`tokenizer` must be a tokenizer with `get_vocab()`, but is {type(tokenizer).__name__}. Pass e.g. "
            "`AutoTokenizer.from_pretrained(target_id)`."
        )
    items = sorted((str(token), int(index)) for token, index in get_vocab().items())
    payload = json.dumps(items, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
