"""Drafter with another tokenizer: any causal LM with its own tokenizer drafts for the target through text.

Users rarely own a small model with the target's exact tokenizer. `TokenizerBridgeDrafter` keeps both tokenizers and
meets the target in text: it reads the target's tokens as text, drafts in its own vocabulary, and turns its new text
back into target tokens that continue the target's sequence exactly. The target verifies them as any other draft.

**A round.** `catch_up(input_ids)` decodes the target's ids to text (special tokens skipped, as transformers does)
and encodes that text with the drafter's tokenizer (its leading special tokens, e.g. BOS, first). The model side is a
`ModelDrafter` held by composition: its KV cache is cropped to the common prefix of the new own ids with those it has
seen and only the rest is ingested, in one forward pass. A re-encoded prefix can change at its end (the accepted
tokens extend the last word, which the drafter's tokenizer then segments differently): the compare-and-crop recomputes
exactly what changed. `draft(input_ids, N)` drafts greedily ``k = ceil((N + 1) * M / L)`` own tokens (`draft_steps`:
``M / L`` is the drafter's tokens per target token on the context, so that about ``N + 1`` target tokens come out,
one more than proposed), stops before a special token of its own, decodes them to the new text ``X`` and maps ``X``
with `continuation_ids`. It proposes at most ``N`` target tokens, possibly none (it abstains: the round goes to the
policy's fallback). Candidates the target's logits processors forbid are cut, as for prompt lookup.

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

**Lossless by construction.** The arm only proposes target token ids; the target verifies them. It has no logits
(``returns_logits = False``): greedy decoding keeps the candidates the target's argmax agrees with; under
``do_sample=True`` verification is transformers' sample-and-compare path (the target samples every position from its
own processed distribution and keeps the draft while it matches), lossless for any proposal. Drafting is greedy in
both modes.

**Rewards.** BE, EAL, cost and speed count target tokens (drafted: the candidates proposed; accepted: those the target
kept), so the arm competes with the other arms on the same scale; its round cost includes the tokenizer work (one
decode and re-encoding of the whole sequence in `catch_up`, a few short ones around the boundary in `draft`).
BD: the arm is one-hot, so its term at a drafted position is the target's probability of the proposed token,
``p_j(x_j)``; EAL under sampling uses the same ``a_j = p_j(x_j)``. The prompt warm start and full-information scoring
skip it (they need the drafter's logits at the target's positions). `last_catch_up_tokens` counts the drafter's own
tokens.

**What comes from transformers, and what does not.** The scheme is transformers' Universal Assisted Generation
(`AssistedCandidateGeneratorDifferentTokenizers`): target ids -> text -> drafter ids, drafting in the drafter's
vocabulary, new text -> target ids, with special tokens skipped in the drafter's view, and a look-behind window
(``target_lookbehind``, 10 in `GenerationConfig`'s defaults, is this drafter's `lookbehind` default). No
code of it is called, because none fits the pool's contract:

* `AssistedCandidateGeneratorDifferentTokenizers` is a one-call `CandidateGenerator`: it runs the assistant's
  ``generate`` and keeps its cache and masks itself. An arm of a pool catches up and drafts in separate steps and its
  cache must survive rounds of other arms: that is `ModelDrafter`'s job, reused here. Its conversion helper
  (``convert_source_tokens_to_target_tokens``) decodes with ``clean_up_tokenization_spaces=True``, which changes the
  text, and its alignment (``_get_tokens_diag``) takes the longest common diagonal of a token-equality matrix over
  the windows, a heuristic that can align on a repeat; the rules above compare exact text boundaries instead.
* `UniversalSpeculativeDecodingGenerator` with `AssistantToTargetTranslator` maps each drafter id to the target id
  of the same token string (the vocabularies' intersection; other tokens suppressed), which gives drafter logits in
  the target vocabulary. That needs every drafted token to be one target token; a drafter token spelling several
  target tokens, or a re-segmented boundary, has no single target position. The drafter contract also asks
  `catch_up` for logits at the target's positions (warm start, full information), which a re-tokenising drafter
  cannot give, and the translator's ``assistant_prune_lm_head`` replaces the assistant's LM head and input
  embeddings in place, a side effect a shared pool drafter must not have. Hence no logits.

**Pool round trip.** The entry references or stores the drafter model as an assistant-model entry does (without
sharing embeddings: the vocabularies differ), and always stores the drafter's tokenizer in the pool
(``drafters/<name>/tokenizer/``). The target's tokenizer comes from the load: ``DrafterPool.from_pretrained(...,
tokenizer=target_tokenizer)``, checked against the fingerprint saved with the entry. A pool saved with
``store_weights=True`` also stores it (once, in ``tokenizers/target/``) and then loads without ``tokenizer=``.

Limitations: the drafter sees the target's text without its special tokens (chat-template markers included); a
tokenizer object is not locked, so two threads sharing one must not change its padding or truncation settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..errors import DrafterCompatibilityError, InvalidPoolError
from . import register_drafter_kind
from .base import Drafter, require_path, target_vocab_size, tokenizer_fingerprint
from .model import ModelDrafter
from .prompt_lookup import logits_processor_filter

if TYPE_CHECKING:
    from ..pool.config import DrafterSpec
    from ..pool.weights import LoadContext, SaveContext

__all__ = ["Continuation", "TokenizerBridgeDrafter", "continuation_ids", "draft_steps", "leading_special_ids"]

#: Target tokens re-read around the boundary (`GenerationConfig`'s default ``target_lookbehind``).
DEFAULT_LOOKBEHIND = 10
#: Largest `lookbehind` a pool file may set (each draft decodes and re-encodes that many tokens).
MAX_LOOKBEHIND = 1024
#: Most own tokens drafted per target token asked for (bounds `draft_steps` for a much finer drafter tokenizer).
MAX_STEPS_PER_TOKEN = 4
#: Folder of the drafter's tokenizer inside its pool folder.
TOKENIZER_DIR = "tokenizer"
_REPLACEMENT = "\ufffd"


# ---------------------------------------------------------------------------------------------------------------------
# text <-> ids, as pure functions
# ---------------------------------------------------------------------------------------------------------------------
def _decode(tokenizer: Any, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def _encode(tokenizer: Any, text: str) -> list[int]:
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
    window_text = _decode(tokenizer, window)
    if window_text.endswith(_REPLACEMENT):
        return Continuation([], "none")
    base = _encode(tokenizer, window_text)
    full = _encode(tokenizer, window_text + text)
    if full[: len(base)] == base:
        ids, rule = full[len(base) :], "exact"
    else:
        ids, rule = _across_boundary(tokenizer, window_text, text, full, _common_prefix(base, full))
    if ids and _decode(tokenizer, window + ids) != window_text + text:
        return Continuation([], "none")
    if not complete:
        ids = ids[:-1]
    return Continuation(ids, rule)


def _across_boundary(tokenizer: Any, context: str, text: str, full: list[int], start: int) -> tuple[list[int], str]:
    """Rules 2-3 when the re-encoding of ``context + text`` changed the end of ``context``'s: find its first token
    boundary at or past the end of `context`; bridge the straddled piece of `text` by encoding it on its own."""
    whole = context + text
    for j in range(start, len(full) + 1):
        decoded = _decode(tokenizer, full[:j])
        if len(decoded) >= len(context) and whole.startswith(decoded):  # a partial character never matches
            piece = decoded[len(context) :]
            if not piece:
                return full[j:], "exact"
            return _encode(tokenizer, piece) + full[j:], "bridged"
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
    plain = _encode(tokenizer, "a")
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


def _check_tokenizer(name: str, tokenizer: Any) -> None:
    if not all(callable(getattr(tokenizer, attr, None)) for attr in ("encode", "decode", "get_vocab", "__len__")):
        raise TypeError(
            f"`{name}` must be a transformers tokenizer (`encode`, `decode`, `get_vocab`), but is "
            f"{type(tokenizer).__name__}. Pass e.g. `AutoTokenizer.from_pretrained(model_id)`."
        )


# ---------------------------------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------------------------------
@register_drafter_kind
class TokenizerBridgeDrafter(Drafter):
    """Drafts with a causal LM that has its **own** tokenizer; proposes target tokens (see the module docstring).

    Args:
        model: the drafter, a transformers causal LM (any vocabulary).
        tokenizer: the drafter's own tokenizer (its ids must fit `model`'s vocabulary).
        target_tokenizer: the target's tokenizer. Optional here (a pool load passes it), required to draft:
            `check_compatible` refuses a drafter without it.
        name: label (default: the model's `name_or_path`).
        lookbehind: target tokens (and own tokens) re-read around the boundary of each conversion, >= 1.

    Example:
        >>> import torch
        >>> from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        >>> from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
        >>> def char_tokenizer(chars):
        ...     raw = Tokenizer(models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=chars[0]))
        ...     raw.pre_tokenizer, raw.decoder = pre_tokenizers.Split(Regex("."), "isolated"), decoders.Fuse()
        ...     return PreTrainedTokenizerFast(tokenizer_object=raw)
        >>> target_tok, own_tok = char_tokenizer("abcdefgh "), char_tokenizer(" hgfedcba")   # other ids
        >>> cfg = LlamaConfig(vocab_size=9, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> _ = torch.manual_seed(0)
        >>> drafter = TokenizerBridgeDrafter(LlamaForCausalLM(cfg), own_tok, target_tokenizer=target_tok, name="d")
        >>> context = torch.tensor([target_tok.encode("abc def")])
        >>> _ = drafter.catch_up(context)
        >>> tokens, logits = drafter.draft(context, 3)
        >>> tokens.shape[1] <= 3, logits, all(0 <= t < len(target_tok) for t in tokens[0].tolist())
        (True, None, True)
        >>> drafter.last_continuation.rule        # character tokenizers: every boundary is a token boundary
        'exact'
    """

    kind = "other_tokenizer"
    returns_logits = False

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        target_tokenizer: Any = None,
        name: str | None = None,
        lookbehind: int = DEFAULT_LOOKBEHIND,
    ) -> None:
        _check_tokenizer("tokenizer", tokenizer)
        if target_tokenizer is not None:
            _check_tokenizer("target_tokenizer", target_tokenizer)
        if not isinstance(lookbehind, int) or isinstance(lookbehind, bool) or lookbehind < 1:
            raise ValueError(
                f"`lookbehind` must be an int >= 1 (tokens re-read around the boundary), but is {lookbehind!r}. "
                f"Use e.g. {DEFAULT_LOOKBEHIND}."
            )
        inner = ModelDrafter(model, name=name)
        super().__init__(inner.name)
        if len(tokenizer) > inner.vocab_size:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must have a `tokenizer` whose ids fit its model's vocabulary size "
                f"{inner.vocab_size}, but the tokenizer has {len(tokenizer)} tokens. Pass the drafter model's own "
                "tokenizer."
            )
        self.tokenizer = tokenizer
        self.target_tokenizer = target_tokenizer
        self.lookbehind = lookbehind
        self._inner = inner
        self._leading = leading_special_ids(tokenizer)
        self._own_special = {int(i) for i in tokenizer.all_special_ids}
        self._logits_width: int | None = None
        self._fresh_state()

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The drafter model (drafting runs on the `ModelDrafter` this drafter holds)."""
        return self._inner.model

    @property
    def setup_seconds(self) -> float:  # type: ignore[override]
        """One-time set-up seconds of the `ModelDrafter` it drafts with (`Drafter.setup_seconds`)."""
        return self._inner.setup_seconds

    @property
    def vocab_size(self) -> None:
        """``None``: the arm returns no logits, so it imposes no logits width on the target."""
        return None

    @property
    def device(self) -> torch.device:
        """The drafter model's device."""
        return self._inner.device

    def in_use(self) -> AbstractContextManager[Any]:
        """The drafter model in eval mode during the call; its training flags back after."""
        return self._inner.in_use()

    def config(self) -> dict[str, Any]:
        return {"lookbehind": self.lookbehind}

    def check_compatible(self, target: Any) -> None:
        """The target's tokenizer must be known and its ids must fit the target's logits (the drafter's vocabulary is
        free: mapping it is the point). Nothing is changed."""
        if self.target_tokenizer is None:
            raise self._missing_target_tokenizer()
        width = target_vocab_size(target)
        if len(self.target_tokenizer) > width:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must have a `target_tokenizer` whose ids fit the target's vocabulary size "
                f"{width}, but it has {len(self.target_tokenizer)} tokens. Pass the target's own tokenizer."
            )

    # ------------------------------------------------------------------ state
    def spawn(self, target: Any = None) -> TokenizerBridgeDrafter:
        """The call's copy; it keeps the target's logits width to apply its logits processors to candidates."""
        clone = super().spawn(target)
        clone._logits_width = None if target is None else target_vocab_size(target)
        return clone

    def reset(self) -> None:
        self._inner = self._inner.spawn()  # a fresh cache on a copy: the shared drafter's is untouched
        self._fresh_state()

    def _fresh_state(self) -> None:
        self._context: torch.Tensor | None = None  # the target ids last caught up on
        self._own: torch.Tensor | None = None  # their text in own ids (None: nothing to draft from)
        #: The last draft's `Continuation` (``None`` before one); for inspection.
        self.last_continuation: Continuation | None = None
        self.last_catch_up_tokens = 0

    def _target_tokenizer(self) -> Any:
        if self.target_tokenizer is None:
            raise self._missing_target_tokenizer()
        return self.target_tokenizer

    def _missing_target_tokenizer(self) -> DrafterCompatibilityError:
        return DrafterCompatibilityError(
            f"drafter {self.name!r} must have the target's tokenizer to map its drafts into the target's "
            "vocabulary, but was built without one (`target_tokenizer=None`). Pass "
            "`TokenizerBridgeDrafter(model, tokenizer, target_tokenizer=target_tokenizer)`, or load its pool with "
            "`DrafterPool.from_pretrained(..., tokenizer=target_tokenizer)`."
        )

    def _caught_up(self, input_ids: torch.Tensor) -> bool:
        context = self._context
        return context is not None and context.shape == input_ids.shape and torch.equal(context, input_ids)

    # ------------------------------------------------------------------ catch up, draft
    @torch.no_grad()
    def catch_up(self, input_ids: torch.LongTensor, *, return_logits: bool | int = False) -> None:
        """Re-read the target's sequence as own ids; the model ingests what differs from its cache. No logits."""
        text = _decode(self._target_tokenizer(), input_ids[0].tolist(), skip_special_tokens=True)
        own = self._leading + _encode(self.tokenizer, text)
        self._context = input_ids.detach().clone()
        self.last_catch_up_tokens = 0
        if not own:  # no text and no leading special token: nothing to draft from
            self._own = None
            return None
        self._own = torch.tensor([own], dtype=torch.long, device=self.device)
        self._inner.catch_up(self._own)
        self.last_catch_up_tokens = self._inner.last_catch_up_tokens
        return None

    @torch.no_grad()
    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, None]:
        """Up to `num_tokens` target tokens continuing `input_ids` (greedy in the drafter's vocabulary, both modes)."""
        empty = input_ids[:, :0]
        if num_tokens < 1:
            return empty, None
        if not self._caught_up(input_ids):
            self.catch_up(input_ids)
        if self._own is None:
            self.last_continuation = Continuation([], "none")
            return empty, None
        steps = draft_steps(num_tokens, self._own.shape[1], input_ids.shape[1])
        drafted = self._inner.draft(self._own, steps)[0][0].tolist()
        complete = False
        for i, token in enumerate(drafted):
            if token in self._own_special:  # the drafter ended its text: what came before is whole
                drafted, complete = drafted[:i], True
                break
        window = self._own[0, -self.lookbehind :].tolist()
        before = _decode(self.tokenizer, window, skip_special_tokens=True)
        after = _decode(self.tokenizer, window + drafted, skip_special_tokens=True)
        if not after.startswith(before):
            self.last_continuation = Continuation([], "none")
            return empty, None
        context = input_ids[0, -self.lookbehind :].tolist()
        found = continuation_ids(
            self.target_tokenizer, context, after[len(before) :], lookbehind=self.lookbehind, complete=complete
        )
        self.last_continuation = found
        ids = found.token_ids[:num_tokens]
        width = self._logits_width
        if width is not None:
            ids = ids[: next((i for i, t in enumerate(ids) if t >= width), len(ids))]
        tokens = torch.tensor(ids, dtype=torch.long, device=input_ids.device)
        allowed = logits_processor_filter(logits_processor, width)
        if allowed is not None and tokens.numel():
            bad = (~allowed(input_ids, tokens)).nonzero()
            if bad.numel():
                tokens = tokens[: int(bad[0, 0])]
        return tokens.reshape(1, -1), None

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The model as an assistant-model entry saves it (a reference, or stored in ``drafters/<name>/`` with its
        embeddings); the drafter's tokenizer always in ``drafters/<name>/tokenizer/``; with stored weights, the
        target's tokenizer in ``tokenizers/target/`` (once per pool). Params: ``tokenizer``, ``target_tokenizer``
        (``None`` unless stored), ``target_tokenizer_hash`` (its `tokenizer_fingerprint`), ``lookbehind`` (an int in
        ``[1, MAX_LOOKBEHIND]``, 1024, in a pool file), ``dtype`` (one of `hf_metasd.pool.weights.DTYPES`)."""
        from ..pool.config import DrafterSpec

        (drafter,) = group
        plan = ctx.model_reference(drafter, drafter.model, share_embeddings=False)  # other vocabulary: nothing shared
        own_folder, own_tokenizer = f"{plan.folder}/{TOKENIZER_DIR}", drafter.tokenizer
        ctx.schedule(lambda root: own_tokenizer.save_pretrained(root / own_folder))
        target_tokenizer = drafter.target_tokenizer
        fingerprint = None if target_tokenizer is None else tokenizer_fingerprint(target_tokenizer)
        target_folder = None
        if plan.stored and target_tokenizer is not None:
            key = ("target_tokenizer", fingerprint)
            target_folder = ctx.shared.get(key)
            if target_folder is None:
                target_folder = ctx.shared[key] = ctx.folder("tokenizers", "target")
                ctx.schedule(lambda root, f=target_folder, t=target_tokenizer: t.save_pretrained(root / f))
        params = {
            "dtype": str(drafter.model.dtype).removeprefix("torch."),
            "lookbehind": drafter.lookbehind,
            "target_tokenizer": target_folder,
            "target_tokenizer_hash": fingerprint,
            "tokenizer": own_folder,
        }
        return DrafterSpec(cls.kind, drafter.name, plan.path, plan.revision, plan.stored, None, params)

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The target's tokenizer first (``ctx.tokenizer``, else the stored copy, checked against the recorded
        fingerprint, else a clear error), then the drafter's tokenizer from the pool, then the model (stored or
        referenced) in ``params.dtype``. Tokenizers are read as untrusted files (`LoadContext.load_tokenizer`)."""
        where = ctx.where(spec)
        cls.validate_spec(spec, where)  # the pool validated it already; a direct call gets the same messages
        target_tokenizer = _target_tokenizer_for(spec, ctx, where)
        tokenizer = ctx.load_tokenizer(spec.params["tokenizer"], where, "tokenizer")
        model = _load_model(spec, ctx, where, ctx.dtype(spec, where))
        lookbehind = spec.params.get("lookbehind", DEFAULT_LOOKBEHIND)

        def construct() -> TokenizerBridgeDrafter:
            return cls(model, tokenizer, target_tokenizer=target_tokenizer, name=spec.name, lookbehind=lookbehind)

        return [ctx.build(spec, cls, construct)]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A `path` to the model, ``params.tokenizer`` inside the pool, ``params.target_tokenizer`` inside the pool or
        ``None`` (a stored copy comes with its ``target_tokenizer_hash``), ``params.lookbehind`` at
        most `MAX_LOOKBEHIND`, no `adapters`."""
        from ..pool.config import check_at_most, check_inside

        require_path(spec, where)
        tokenizer = spec.params.get("tokenizer")
        if not isinstance(tokenizer, str) or not tokenizer:
            raise InvalidPoolError(
                f"{where} must have `params.tokenizer` (the drafter's tokenizer folder inside the pool), but has "
                f"{tokenizer!r}. Re-save the pool with `DrafterPool.save_pretrained`."
            )
        check_inside(tokenizer, f"{where} `params.tokenizer`")
        check_inside(spec.params.get("target_tokenizer"), f"{where} `params.target_tokenizer`")
        fingerprint = spec.params.get("target_tokenizer_hash")
        if fingerprint is not None and (not isinstance(fingerprint, str) or len(fingerprint) != 64):
            raise InvalidPoolError(
                f"{where} `params.target_tokenizer_hash` must be a `tokenizer_fingerprint` (64 hex digits), but is "
                f"{fingerprint!r}. Re-save the pool with `DrafterPool.save_pretrained`."
            )
        if spec.params.get("target_tokenizer") is not None and fingerprint is None:
            raise InvalidPoolError(
                f"{where} must record the fingerprint of the target's tokenizer it stores "
                "(`params.target_tokenizer_hash`), but has none. Re-save the pool with `DrafterPool.save_pretrained`."
            )
        check_at_most(spec.params.get("lookbehind"), f"{where} `params.lookbehind`", MAX_LOOKBEHIND)
        super().validate_spec(spec, where)


# ---------------------------------------------------------------------------------------------------------------------
# loading helpers (the pool's `LoadContext` reads; the vocabulary check of assistant-model entries does not apply)
# ---------------------------------------------------------------------------------------------------------------------
def _target_tokenizer_for(spec: DrafterSpec, ctx: LoadContext, where: str) -> Any:
    given = getattr(ctx, "tokenizer", None)
    expected = spec.params.get("target_tokenizer_hash")
    if given is not None:
        if expected is not None:
            key = ("tokenizer_fingerprint", id(given))
            if key not in ctx.bases:
                ctx.bases[key] = (given, tokenizer_fingerprint(given))  # keep `given` alive: ids stay unique
            found = ctx.bases[key][1]
            if found != expected:
                raise DrafterCompatibilityError(
                    f"{where} must be loaded with the target's tokenizer it was saved for (fingerprint {expected}), "
                    f"but `tokenizer=` has fingerprint {found}. Pass the target's own tokenizer, e.g. "
                    "`DrafterPool.from_pretrained(..., tokenizer=AutoTokenizer.from_pretrained(target_id))`."
                )
        return given
    stored = spec.params.get("target_tokenizer")
    if stored is None:
        raise DrafterCompatibilityError(
            f"{where} needs `tokenizer=` (the target's tokenizer) to load: it drafts with its own tokenizer and maps "
            "its drafts into the target's vocabulary, and the pool stores no copy of the target's. Pass "
            "`DrafterPool.from_pretrained(..., tokenizer=target_tokenizer)`."
        )
    key = ("tokenizer", stored)
    if key not in ctx.bases:
        expected = spec.params.get("target_tokenizer_hash")
        ctx.bases[key] = ctx.load_tokenizer(stored, where, "target's tokenizer", expected_hash=expected)
    return ctx.bases[key]


def _load_model(spec: DrafterSpec, ctx: LoadContext, where: str, dtype: torch.dtype) -> Any:
    """The entry's causal LM (stored in the pool, a folder the caller mapped, or a Hub id with its revision), on the
    target's device; its vocabulary is its own tokenizer's, not the target's."""
    location = ctx.resolve(spec, where, need_folder=False)
    if spec.stored and ctx.mapped(spec.path) is None:
        return ctx.load_base(location, where, share=False, dtype=dtype, check_vocab=False)
    model = ctx.load_reference(spec, where, location, dtype=dtype, check_vocab=False)
    device = getattr(ctx.target, "device", None)
    return (model if device is None else model.to(device)).eval()
