"""Assistant-model drafter: any causal LM that shares the target's vocabulary, with its own KV cache."""

from __future__ import annotations

import functools
import inspect
import threading
from contextlib import AbstractContextManager
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel

from .._compat import activate_past_recording
from ..errors import DrafterCompatibilityError
from .base import Drafter, eval_mode
from .load import LoadContext
from .prefill import (
    SHORTEST_CATCH_UP,
    PrefillChoice,
    cast_cache,
    choose_prefill_dtype,
    float32_body,
    float32_prefill_applies,
)
from .registry import register_drafter_kind
from .save import SaveContext
from .spec import DrafterSpec, require_path
from .vocab import target_vocab_size

__all__ = ["ModelDrafter"]

#: Positions at the end of each forward pass whose recurrent states a drafter's cache records (recurrent and hybrid
#: models: mamba, jamba, qwen3_next, ...). A rollback drops drafted tokens, each fed alone and always recorded, or the
#: last token of a catch-up (re-fed for its logits). Recorded positions also run one by one, exactly as in plain
#: decoding: a catch-up of more tokens runs its first ones through the model's chunked scan, which on some models
#: (mamba, falcon_mamba) ignores part of the cached state, so the drafts are less likely to be accepted (never wrong).
#: 32 covers a drafter's catch-up after several rounds of other drafters, and bounds the states a prompt's prefill
#: holds.
RECURRENT_STATES_TO_KEEP = 32


def _common_prefix_length(cached: torch.Tensor, input_ids: torch.Tensor) -> int:
    """Length of the shared prefix of two ``(1, *)`` id tensors."""
    n = min(cached.shape[1], input_ids.shape[1])
    if n == 0:
        return 0
    differs = (cached[0, :n] != input_ids[0, :n].to(cached.device)).nonzero()
    return int(differs[0, 0]) if differs.numel() else n


@register_drafter_kind
class ModelDrafter(Drafter):
    r"""Drafts with a small causal LM (the paper's black-box drafter).

    The drafter keeps a `DynamicCache` across rounds. `catch_up` crops the cache to the prefix it shares with the
    current sequence (drafted tokens the target rejected are dropped) and ingests the missing tokens in **one**
    forward pass, however many rounds other drafters ran in between; `draft` then runs up to `num_tokens` single-token
    steps.

    Args:
        model: a `PreTrainedModel` causal LM whose vocabulary is the target's.
        name: label (default: the model's `name_or_path`).
        head_token_ids: optional ``(K,)`` token ids. The LM head is evaluated only on these rows and the other logits
            are ``-inf`` (the drafter can only propose these tokens). This cuts a small drafter's dominant cost, its
            vocabulary projection, and leaves verification exact. Needs `model.get_output_embeddings()`.
        float32_prefill: for a bfloat16 / float16 model on CPU, whether multi-token catch-ups (the prompt's
            prefill above all) run through a float32 copy of the model's body. ``None`` (default): decided by
            measurement on the first such catch-up, for each catch-up length
            (`~hf_metasd.drafters.prefill.choose_prefill_dtype`, cached per process; `prefill_choice` tells what was
            found); ``True`` / ``False`` force it for every multi-token catch-up / none. Ignored (``None``) or
            refused (``True``) for models where it does not apply, such as float32 ones. The float32 copy holds
            twice the bfloat16 body's memory and is taken on first use: a drafter whose weights change after that
            keeps drafting from the old copy on catch-ups (still lossless); build a new `ModelDrafter` then.

    Attributes:
        context_length: the positions the model can take when it learned a table of absolute position embeddings
            (GPT-2's ``n_positions``, OPT's ``max_position_embeddings``; `context_length_of`), else ``None``. Where
            the conversation outgrows it, the drafter abstains (`draft` proposes nothing; the round goes to the
            policy's fallback) and its drafts stop at its last position.

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> _ = torch.manual_seed(0)
        >>> drafter = ModelDrafter(LlamaForCausalLM(cfg), name="tiny")
        >>> _ = drafter.catch_up(torch.tensor([[1, 2, 3]]))
        >>> tokens, logits = drafter.draft(torch.tensor([[1, 2, 3]]), 4)
        >>> tokens.shape, logits.shape
        (torch.Size([1, 4]), torch.Size([1, 4, 64]))
    """

    kind = "assistant_model"

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        name: str | None = None,
        head_token_ids: torch.Tensor | None = None,
        float32_prefill: bool | None = None,
    ) -> None:
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"`model` must be a transformers causal LM, but is {type(model).__name__}. "
                "Pass e.g. `AutoModelForCausalLM.from_pretrained(...)`."
            )
        if getattr(model.config, "is_encoder_decoder", False):
            raise DrafterCompatibilityError(
                f"drafter {name or model.name_or_path!r} must be a decoder-only causal LM, but is encoder-decoder "
                f"({type(model).__name__}). Use a decoder-only drafter."
            )
        if float32_prefill is not None and not isinstance(float32_prefill, bool):
            raise TypeError(
                f"`float32_prefill` must be True, False or None, but is {float32_prefill!r}. "
                "Pass None to decide by measurement."
            )
        applies = float32_prefill_applies(model)
        if float32_prefill and not applies:
            raise ValueError(
                f"`float32_prefill` must be True only for a bfloat16 or float16 causal LM on CPU with a plain "
                f"KV cache, but the model is {type(model).__name__} in {next(model.parameters()).dtype} on "
                f"{next(model.parameters()).device}. Pass None or False."
            )
        super().__init__(name or getattr(model, "name_or_path", None) or type(model).__name__)
        self.model = model
        self.float32_prefill = float32_prefill if applies else False
        # shared by every `spawn`ed copy: the float32 body is built, and the choice made, once per drafter
        self._prefill: dict[str, Any] = {"lock": threading.Lock(), "body": None, "choice": None}
        self._vocab_size = target_vocab_size(model)
        self.context_length = context_length_of(model)
        self.head_token_ids: torch.Tensor | None = None
        if head_token_ids is not None:
            self.set_head_token_ids(head_token_ids)
        self.reset()

    # ------------------------------------------------------------------ properties
    @property
    def vocab_size(self) -> int:
        """Logits width of the drafter model."""
        return self._vocab_size

    @property
    def device(self) -> torch.device:
        """The drafter model's device."""
        return self.model.device

    def in_use(self) -> AbstractContextManager[Any]:
        """The drafter model in eval mode during the call; its training flags back after."""
        return eval_mode(self.model)

    @property
    def prefill_choice(self) -> PrefillChoice | None:
        """How this drafter's multi-token catch-ups run: ``None`` until the first one, then a
        `~hf_metasd.drafters.prefill.PrefillChoice` (measured, or forced by `float32_prefill`)."""
        return self._prefill["choice"]

    def config(self) -> dict[str, Any]:
        return {"num_head_tokens": None if self.head_token_ids is None else int(self.head_token_ids.numel())}

    # ------------------------------------------------------------------ pool config round trip
    @classmethod
    def to_spec(cls, group: list[Drafter], ctx: SaveContext) -> DrafterSpec:
        """A reference to the model's source (Hub id or folder, with the commit it came from), or, when stored, its
        weights in ``drafters/<name>/`` (without the embedding and LM head when they are the target's). Params:
        ``share_target_embeddings``, ``head_token_ids`` (a JSON file in the pool) and ``dtype``."""
        (drafter,) = group
        plan = ctx.model_reference(drafter, drafter.model, share_embeddings=True)
        params = {
            "share_target_embeddings": plan.share_target_embeddings,
            "head_token_ids": ctx.head(drafter, plan.folder),
            "dtype": str(drafter.model.dtype).removeprefix("torch."),
        }
        return DrafterSpec(cls.kind, drafter.name, plan.path, plan.revision, plan.stored, None, params)

    @classmethod
    def from_spec(cls, spec: DrafterSpec, ctx: LoadContext) -> list[Drafter]:
        """The model of the entry (stored, shared-embedding or referenced), in ``params.dtype``, with its head."""
        where = ctx.where(spec)
        head_ids = ctx.head_ids(spec, where)
        share = ctx.share(spec, where)
        model = ctx.load_model(spec, where, share=share, dtype=ctx.dtype(spec, where))
        drafter = ctx.build(spec, cls, lambda: cls(model, name=spec.name, head_token_ids=head_ids))
        drafter.source = ctx.source(spec, share_target_embeddings=share)
        return [drafter]

    @classmethod
    def validate_spec(cls, spec: DrafterSpec, where: str) -> None:
        """A model entry needs a `path` (and no `adapters`)."""
        require_path(spec, where)
        super().validate_spec(spec, where)

    def set_head_token_ids(self, head_token_ids: torch.Tensor | list[int]) -> None:
        """Restrict the LM head to `head_token_ids` (see the class docstring)."""
        ids = torch.as_tensor(head_token_ids, dtype=torch.long).flatten().unique()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self._vocab_size:
            raise ValueError(
                f"`head_token_ids` must be non-empty ids in [0, {self._vocab_size}), but has {ids.numel()} ids in "
                f"[{int(ids.min()) if ids.numel() else '-'}, {int(ids.max()) if ids.numel() else '-'}]. "
                "Pass the token ids the drafter may propose."
            )
        head = self.model.get_output_embeddings()
        if head is None:
            raise DrafterCompatibilityError(
                f"drafter {self.name!r} must expose `get_output_embeddings()` to restrict its head, but returns None. "
                "Drop `head_token_ids`."
            )
        self.head_token_ids = ids.to(self.model.device)
        self._head_weight = head.weight.detach()[self.head_token_ids]
        self._head_bias = None if getattr(head, "bias", None) is None else head.bias.detach()[self.head_token_ids]

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        self._cache: DynamicCache | None = None
        self._cached_tokens = 0  # positions the cache holds: where the next forward's `position_ids` start
        self._ids = torch.empty(1, 0, dtype=torch.long, device=self.model.device)
        self._next_logits: torch.Tensor | None = None
        self.last_catch_up_tokens = 0

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        if hasattr(cache, "activate_past_recording"):
            # sliding-window layers must be croppable; recurrent layers record states (see `RECURRENT_STATES_TO_KEEP`)
            activate_past_recording(cache, RECURRENT_STATES_TO_KEEP)
        return cache

    # ------------------------------------------------------------------ forward
    def _float32_body(self, num_tokens: int) -> torch.nn.Module | None:
        """The float32 body if a catch-up of `num_tokens` takes it (built and decided on first use), else ``None``."""
        if self.float32_prefill is False or num_tokens < SHORTEST_CATCH_UP:
            return None
        state = self._prefill
        with state["lock"]:
            if state["choice"] is None:
                state["body"] = float32_body(self.model)
                if self.float32_prefill is None:
                    state["choice"] = choose_prefill_dtype(self.model, state["body"])
                else:
                    state["choice"] = PrefillChoice(SHORTEST_CATCH_UP)
                if state["choice"].min_tokens is None:
                    state["body"] = None
            return state["body"] if state["choice"].takes_float32(num_tokens) else None

    def _forward(self, ids: torch.Tensor, num_logits: int) -> torch.Tensor:
        """Run `ids` through the model on the cache; return float32 logits ``(1, num_logits, V)``."""
        start, self._cached_tokens = self._cached_tokens, self._cached_tokens + ids.shape[1]
        if (body := self._float32_body(ids.shape[1])) is not None:
            cast_cache(self._cache, torch.float32)
            try:
                embeds = self.model.get_input_embeddings()(ids).float()
                out = body(inputs_embeds=embeds, cache=self._cache, use_cache=True, **_positions(body, start, ids))
            finally:
                cast_cache(self._cache, self.model.dtype)
            return self._logits(out.last_hidden_state[:, -num_logits:].to(self.model.dtype))
        if self.head_token_ids is None:
            positions = _positions(self.model, start, ids)
            out = self.model(input_ids=ids, cache=self._cache, use_cache=True, logits_to_keep=num_logits, **positions)
            return out.logits.float()
        out = self.model.base_model(
            input_ids=ids, cache=self._cache, use_cache=True, **_positions(self.model.base_model, start, ids)
        )
        return self._logits(out.last_hidden_state[:, -num_logits:])

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``(1, m, V)`` of last hidden states ``(1, m, H)`` through the (restricted) LM head."""
        if self.head_token_ids is None:
            return self.model.get_output_embeddings()(hidden).float()
        sub = torch.nn.functional.linear(hidden, self._head_weight, self._head_bias).float()
        logits = sub.new_full((*sub.shape[:-1], self._vocab_size), float("-inf"))
        logits[..., self.head_token_ids] = sub
        return logits

    def _draftable(self, sequence_length: int, num_tokens: int) -> int:
        """How many of `num_tokens` tokens the drafter can draft after `sequence_length` tokens: its drafting steps
        feed every drafted token but the last, at positions up to its `context_length` - 1 (0: it abstains)."""
        if self.context_length is None:
            return num_tokens
        return max(0, min(num_tokens, self.context_length - sequence_length + 1))

    @torch.no_grad()
    def catch_up(self, input_ids: torch.LongTensor, *, return_logits: bool | int = False) -> torch.Tensor | None:
        """Ingest what the cache lacks of `input_ids` (see `Drafter.catch_up`); nothing, and ``None``, where the
        sequence is longer than the drafter's `context_length` (it abstains there)."""
        if self._draftable(input_ids.shape[1], 1) == 0:
            self._next_logits = None
            self.last_catch_up_tokens = 0
            return None
        input_ids = input_ids.to(self.model.device)
        if self._cache is None:
            self._cache = self._new_cache()
            self._ids = input_ids[:, :0]
        cached = self._ids.shape[1]
        keep = min(_common_prefix_length(self._ids, input_ids), input_ids.shape[1] - 1)
        if keep < cached:
            self._cache.crop(keep - cached)
        self._cached_tokens = keep
        new = input_ids[:, keep:]
        if return_logits is True:
            num_logits = new.shape[1]
        else:
            num_logits = max(1, min(int(return_logits), new.shape[1]))
        logits = self._forward(new, num_logits)
        self._next_logits = logits[:, -1]
        self._ids = input_ids
        self.last_catch_up_tokens = new.shape[1]
        return logits if return_logits else None

    @torch.no_grad()
    def draft(
        self,
        input_ids: torch.LongTensor,
        num_tokens: int,
        *,
        logits_processor: Any = None,
        do_sample: bool = False,
    ) -> tuple[torch.LongTensor, torch.FloatTensor]:
        """Up to `num_tokens` tokens after `input_ids` ``(1, L)`` and their processed logits ``(1, n, V)``.

        A step whose processed logits are no distribution (a NaN, a ``+inf``, or every entry ``-inf``: NaN weights,
        an overflow in half precision, a processor that masks every token) ends the draft before its token: the
        tokens drafted before it are returned, and none when it is the first step, so that the drafter abstains
        from the round (`Drafter.draft`) instead of failing the call. Whether to stop there depends on the drafter's
        own distributions only, so the draft stays a valid proposal for speculative sampling. The steps are checked
        together after the loop (one device sync per draft, not one per token); a sampled step samples from a
        stand-in distribution meanwhile, whose token is dropped. A drafter with a `context_length` drafts no token
        past its last position, and none once the sequence is longer than it.
        """
        num_tokens = self._draftable(input_ids.shape[1], num_tokens)
        if num_tokens == 0:
            return input_ids[:, :0], None
        if self._next_logits is None or self._ids.shape[1] != input_ids.shape[1]:
            self.catch_up(input_ids)
        ids = input_ids.to(self.model.device)
        logits = self._next_logits
        tokens, scores, valid = [], [], []
        for step in range(num_tokens):
            if logits_processor is not None and len(logits_processor) > 0:
                logits = logits_processor(ids, logits.clone())
            # a distribution iff the largest logit is finite (NaN, +inf and "all -inf" all make it non-finite)
            valid.append(torch.isfinite(logits.amax(dim=-1)))
            if do_sample:
                # softmax of logits that are no distribution holds NaN: uniform stand-in, the step is dropped below
                token = torch.multinomial(torch.softmax(logits, dim=-1).nan_to_num(nan=1.0), num_samples=1)
            else:
                token = logits.argmax(dim=-1, keepdim=True)
            tokens.append(token)
            scores.append(logits)
            ids = torch.cat([ids, token], dim=-1)
            if step == num_tokens - 1:
                break
            logits = self._forward(token, 1)[:, -1]
        # the cache now covers everything but the last drafted token
        self._ids = ids[:, :-1]
        self._next_logits = None
        kept = int(torch.cat(valid).long().cumprod(0).sum()) if valid else 0  # steps before the first invalid one
        if kept == 0:
            return ids[:, :0], None
        return torch.cat(tokens[:kept], dim=-1), torch.stack(scores[:kept], dim=1)


def context_length_of(model: torch.nn.Module) -> int | None:
    """The positions `model` can take if it learned absolute position embeddings, else ``None`` (rotary, ALiBi or
    sinusoidal positions: no table to run past).

    The limit is the config's ``n_positions`` / ``max_position_embeddings`` / ``n_ctx`` when the model holds a table
    of that many position embeddings: an `nn.Embedding` other than the token embedding with that many rows (OPT's
    holds two more, its offset).

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
        >>> context_length_of(GPT2LMHeadModel(GPT2Config(n_embd=8, n_layer=1, n_head=2, n_positions=16)))
        16
        >>> llama = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                     num_attention_heads=2, max_position_embeddings=16)
        >>> context_length_of(LlamaForCausalLM(llama)) is None
        True
    """
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limits = [getattr(config, key, None) for key in ("n_positions", "max_position_embeddings", "n_ctx")]
    limit = next((v for v in limits if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)
    if limit is None:
        return None
    tokens = model.get_input_embeddings()
    for module in model.modules():
        if (
            isinstance(module, torch.nn.Embedding)
            and module is not tokens
            and limit <= module.num_embeddings <= limit + 2
        ):
            return limit
    return None


@functools.cache
def _takes_position_ids(module_class: type) -> bool:
    return "position_ids" in inspect.signature(module_class.forward).parameters


def _positions(module: torch.nn.Module, start: int, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """``position_ids`` for `ids` fed after `start` cached positions, for a module whose forward takes them. Most
    models number new positions from their cache themselves; some do not (Bamba numbers from 0 without them), so a
    drafter always says where its tokens stand."""
    if not _takes_position_ids(type(module)):
        return {}
    return {"position_ids": torch.arange(start, start + ids.shape[1], device=ids.device).unsqueeze(0)}
