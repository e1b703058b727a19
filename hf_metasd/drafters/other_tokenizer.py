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
to target ids with `~hf_metasd.drafters.retokenize.continuation_ids` (the re-tokenisation rules are in
`hf_metasd.drafters.retokenize`). It proposes at most ``N`` target tokens, possibly none (it abstains: the round
goes to the policy's fallback). Candidates the target's logits processors forbid are cut, as for prompt lookup.

**Lossless by construction.** The arm only proposes target token ids; the target verifies them. It has no logits
(``returns_logits = False``): greedy decoding keeps the candidates the target's argmax agrees with; under
``do_sample=True`` verification is transformers' sample-and-compare path (the target samples every position from its
own processed distribution and keeps the draft while it matches), lossless for any proposal. Drafting is greedy in
both modes.

**Rewards.** BE, EAL, cost and speed count target tokens (drafted: the candidates proposed; accepted: those the target
kept), so the arm competes with the other arms on the same scale; its round cost includes the tokenizer work (one
decode and re-encoding of the whole sequence in `catch_up`, a few short ones around the boundary in `draft`).
BD: the arm is one-hot, so its term at a drafted position is the target's probability of the proposed token,
``p_j(x_j)``; EAL under sampling uses the same ``a_j = p_j(x_j)``. Full-information scoring skips it (it needs
the drafter's logits at the target's positions). `last_catch_up_tokens` counts the drafter's own
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
  `catch_up` for logits at the target's positions (full information), which a re-tokenising drafter
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

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from ..errors import DrafterCompatibilityError, InvalidPoolError
from ..untrusted import PROBE_TEXT, is_rust_panic
from .base import Drafter, int_error
from .candidates import CandidateDrafter, IsAllowed, allowed_prefix
from .load import LoadContext
from .model import ModelDrafter
from .registry import register_drafter_kind
from .retokenize import (
    DEFAULT_LOOKBEHIND,
    Continuation,
    check_tokenizer,
    continuation_ids,
    decode_ids,
    draft_steps,
    encode_text,
    leading_special_ids,
)
from .save import SaveContext
from .spec import DrafterSpec, check_at_most, check_inside, require_path
from .vocab import target_vocab_size, tokenizer_fingerprint

__all__ = ["TokenizerBridgeDrafter"]

#: Largest `lookbehind` a pool file may set (each draft decodes and re-encodes that many tokens).
MAX_LOOKBEHIND = 1024
#: Folder of the drafter's tokenizer inside its pool folder.
TOKENIZER_DIR = "tokenizer"


# ---------------------------------------------------------------------------------------------------------------------
# the drafter
# ---------------------------------------------------------------------------------------------------------------------
def _probe(tokenizer: Any) -> None:
    """A short encode and decode (`PROBE_TEXT`, as a pool's load reads a tokenizer): a tokenizer that cannot read
    ordinary text fails here, before any forward pass, rather than in the middle of `generate`."""
    decode_ids(tokenizer, encode_text(tokenizer, PROBE_TEXT))


@contextmanager
def _tokenizer_panics(name: str, doing: str) -> Iterator[None]:
    """A Rust panic of a tokenizer while `doing` (pyo3's ``PanicException``, a `BaseException` that ``except
    Exception`` lets through: a pre-tokenizer or normalizer pattern that backtracks without end) becomes a
    `DrafterCompatibilityError` naming drafter `name`; anything else passes as it is."""
    try:
        yield
    except BaseException as err:
        if not is_rust_panic(err):
            raise
        detail = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        raise DrafterCompatibilityError(
            f"drafter {name!r} must have tokenizers that read every text, but one panicked {doing} "
            f"(PanicException: {detail}). Use tokenizers whose regular expressions (pre-tokenizer, normalizer) match "
            "in linear time, or take this drafter out of the pool."
        ) from err


@register_drafter_kind
class TokenizerBridgeDrafter(CandidateDrafter):
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

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        target_tokenizer: Any = None,
        name: str | None = None,
        lookbehind: int = DEFAULT_LOOKBEHIND,
    ) -> None:
        check_tokenizer("tokenizer", tokenizer)
        if target_tokenizer is not None:
            check_tokenizer("target_tokenizer", target_tokenizer)
        if not isinstance(lookbehind, int) or isinstance(lookbehind, bool) or lookbehind < 1:
            raise int_error(lookbehind)(
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
        with _tokenizer_panics(self.name, "reading a short text"):
            self._leading = leading_special_ids(tokenizer)
            _probe(tokenizer)
        self._own_special = {int(i) for i in tokenizer.all_special_ids}
        self._fresh_state()

    # ------------------------------------------------------------------ properties
    @property
    def model(self) -> Any:
        """The drafter model (drafting runs on the `ModelDrafter` this drafter holds)."""
        return self._inner.model

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
        with _tokenizer_panics(self.name, "reading a short text"):
            _probe(self.target_tokenizer)
        width = target_vocab_size(target)
        if len(self.target_tokenizer) > width:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must have a `target_tokenizer` whose ids fit the target's vocabulary size "
                f"{width}, but it has {len(self.target_tokenizer)} tokens. Pass the target's own tokenizer."
            )

    # ------------------------------------------------------------------ state
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
        with _tokenizer_panics(self.name, f"re-reading the {input_ids.shape[1]} tokens of the sequence"):
            text = decode_ids(self._target_tokenizer(), input_ids[0].tolist(), skip_special_tokens=True)
            own = self._leading + encode_text(self.tokenizer, text)
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
    def candidates(self, input_ids: torch.LongTensor, num_tokens: int, is_allowed: IsAllowed | None) -> torch.Tensor:
        """Up to `num_tokens` target tokens continuing `input_ids` (greedy in the drafter's vocabulary, both modes)."""
        empty = input_ids[0, :0]
        if not self._caught_up(input_ids):
            self.catch_up(input_ids)
        if self._own is None:
            self.last_continuation = Continuation([], "none")
            return empty
        steps = draft_steps(num_tokens, self._own.shape[1], input_ids.shape[1])
        drafted = self._inner.draft(self._own, steps)[0][0].tolist()
        complete = False
        for i, token in enumerate(drafted):
            if token in self._own_special:  # the drafter ended its text: what came before is whole
                drafted, complete = drafted[:i], True
                break
        with _tokenizer_panics(self.name, "mapping a draft to the target's tokens"):
            found = self._continuation(input_ids, drafted, complete)
        if found is None:
            self.last_continuation = Continuation([], "none")
            return empty
        self.last_continuation = found
        ids = found.token_ids[:num_tokens]
        width = self._logits_width
        if width is not None:
            ids = ids[: next((i for i, t in enumerate(ids) if t >= width), len(ids))]
        return allowed_prefix(torch.tensor(ids, dtype=torch.long, device=input_ids.device), input_ids, is_allowed)

    def _continuation(self, input_ids: torch.LongTensor, drafted: list[int], complete: bool) -> Continuation | None:
        """The target ids of the `drafted` own ids' text (None: decoding them changes the text before them)."""
        window = self._own[0, -self.lookbehind :].tolist()
        before = decode_ids(self.tokenizer, window, skip_special_tokens=True)
        after = decode_ids(self.tokenizer, window + drafted, skip_special_tokens=True)
        if not after.startswith(before):
            return None
        context = input_ids[0, -self.lookbehind :].tolist()
        return continuation_ids(
            self.target_tokenizer, context, after[len(before) :], lookbehind=self.lookbehind, complete=complete
        )

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """The model as an assistant-model entry saves it (a reference, or stored in ``drafters/<name>/`` with its
        embeddings); the drafter's tokenizer always in ``drafters/<name>/tokenizer/``; with stored weights, the
        target's tokenizer in ``tokenizers/target/`` (once per pool). Params: ``tokenizer``, ``target_tokenizer``
        (``None`` unless stored), ``target_tokenizer_hash`` (its `tokenizer_fingerprint`), ``lookbehind`` (an int in
        ``[1, MAX_LOOKBEHIND]``, 1024, in a pool file), ``dtype`` (one of `hf_metasd.drafters.spec.DTYPES`)."""
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
        # its vocabulary is its own tokenizer's, not the target's
        model = ctx.load_model(spec, where, dtype=ctx.dtype(spec, where), check_vocab=False)
        lookbehind = spec.params.get("lookbehind", DEFAULT_LOOKBEHIND)

        def construct() -> TokenizerBridgeDrafter:
            return cls(model, tokenizer, target_tokenizer=target_tokenizer, name=spec.name, lookbehind=lookbehind)

        return [ctx.build(spec, cls, construct)]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A `path` to the model, ``params.tokenizer`` inside the pool, ``params.target_tokenizer`` inside the pool or
        ``None`` (a stored copy comes with its ``target_tokenizer_hash``), ``params.lookbehind`` at
        most `MAX_LOOKBEHIND`, no `adapters`."""
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
# the target's tokenizer at load
# ---------------------------------------------------------------------------------------------------------------------
def _target_tokenizer_for(spec: DrafterSpec, ctx: LoadContext, where: str) -> Any:
    """The load's `tokenizer=` (its fingerprint checked against the recorded one), else the pool's stored copy (read
    once per pool), else a clear error."""
    given = ctx.tokenizer
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
