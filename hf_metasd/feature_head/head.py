"""`FeatureHead`: an EAGLE-3-style draft head that drafts from the target's hidden features.

Notation: the target has ``L`` layers, hidden size ``H`` and vocabulary ``V``; the head fuses ``k`` target layers
(``config.layer_ids``) and predicts over a draft vocabulary of ``Vd <= V`` tokens. For target position ``p`` let
``f_p = [h_p^(s_1); ...; h_p^(s_k)]`` (shape ``(k H,)``) be the target's features there (`FeatureRecorder` records
them) and ``x_p`` the token there; ``E`` is the **target's own** input embedding (shared, never copied).

Head entry ``j`` pairs the feature of position ``j`` with the token that follows it and sits at rotary position
``j + 1`` (the position of that token), as in speculators' training::

    g_j = fc(input_norm(f_j))                      (k H -> H; input_norm only with `norm_before_fc`)
    g_j = fc([fc_norm_1(h_j^(s_1)); ...])          (instead, with `fc_norm`: one RMSNorm per fused layer)
    a_j = [input_layernorm(E[x_{j+1}]); hidden_norm(g_j)]                                         (2 H)
    u_j = r_j + o_proj(Attention(q_proj a_j, k_proj a_{<=j}, v_proj a_{<=j}))   r_j = g_j, or hidden_norm(g_j)
                                                                                with `norm_before_residual`
    o_j = u_j + MLP(post_attention_layernorm(u_j))                                                  (H)
    z_j = lm_head(norm(o_j))                       logits over the draft vocabulary                 (Vd)

The draft token ``d`` of ``z_j`` is the target token ``d + d2t[d]``; ``t2d[t]`` says whether target token ``t`` is in
the draft vocabulary. Drafting step ``t > 0`` has no target feature for the token just drafted: it feeds the head's
own output ``o_j`` in place of ``g_{j+1}`` (no ``fc``), as EAGLE-3's training-time test does; with `norm_output` it
feeds ``norm(o_j)`` instead (speculators' ``norm_output``, vLLM's ``aux_output``). Keys and values of every entry stay
in a `FeatureHeadCache` (one per sequence), which `FeatureHeadCache.crop` rolls back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from ..errors import InvalidPoolError, MetaSDConfigError, MetaSDTypeError
from .config import FeatureHeadConfig
from .vocab import vocab_map

__all__ = ["FeatureHead", "FeatureHeadCache"]


class FeatureHeadCache:
    """Keys and values of one sequence's head entries, ``(B, num_key_value_heads, length, head_dim)`` each.

    ``committed`` entries came from target features (kept across rounds); the entries after them came from the head's
    own outputs while drafting and are dropped by the next `FeatureHead.draft` (or by `crop`).
    """

    def __init__(self) -> None:
        self.key: torch.Tensor | None = None
        self.value: torch.Tensor | None = None
        self.committed = 0

    @property
    def length(self) -> int:
        return 0 if self.key is None else self.key.shape[2]

    def append(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add entries; return all keys and values."""
        self.key = key if self.key is None else torch.cat([self.key, key], dim=2)
        self.value = value if self.value is None else torch.cat([self.value, value], dim=2)
        return self.key, self.value

    def crop(self, length: int) -> None:
        """Keep the first `length` entries (``0 <= length <= self.length``)."""
        if not isinstance(length, int) or isinstance(length, bool) or not 0 <= length <= self.length:
            raise MetaSDConfigError(
                f"`length` must be an int in [0, {self.length}] (the cache's length), but is {length!r}. Crop to a "
                "length the cache has."
            )
        if self.key is not None:
            self.key, self.value = self.key[:, :, :length], self.value[:, :, :length]
        self.committed = min(self.committed, length)


class _Attention(nn.Module):
    """Grouped-query attention whose projections read ``2 H`` inputs; it keeps its keys and values in a cache."""

    def __init__(self, config: FeatureHeadConfig) -> None:
        super().__init__()
        heads, kv_heads, dim, bias = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.attention_bias,
        )
        self.heads, self.kv_heads, self.dim = heads, kv_heads, dim
        self.q_proj = nn.Linear(2 * config.hidden_size, heads * dim, bias=bias)
        self.k_proj = nn.Linear(2 * config.hidden_size, kv_heads * dim, bias=bias)
        self.v_proj = nn.Linear(2 * config.hidden_size, kv_heads * dim, bias=bias)
        self.o_proj = nn.Linear(heads * dim, config.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: FeatureHeadCache) -> torch.Tensor:
        batch, new = x.shape[:2]
        q = self.q_proj(x).view(batch, new, self.heads, self.dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, new, self.kv_heads, self.dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, new, self.kv_heads, self.dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        past = cache.length
        k, v = cache.append(k, v)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        mask = None
        if new > 1:  # entry past + i sees entries 0 .. past + i
            mask = (
                torch.arange(past + new, device=x.device)[None, :]
                <= past + torch.arange(new, device=x.device)[:, None]
            )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, new, self.heads * self.dim))


class _MLP(nn.Module):
    def __init__(self, config: FeatureHeadConfig) -> None:
        super().__init__()
        hidden, width, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, width, bias=bias)
        self.up_proj = nn.Linear(hidden, width, bias=bias)
        self.down_proj = nn.Linear(width, hidden, bias=bias)
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class _DecoderLayer(nn.Module):
    """EAGLE-3's first decoder layer: attention over ``[input_layernorm(embeds); hidden_norm(hidden)]``."""

    def __init__(self, config: FeatureHeadConfig) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = _Attention(config)
        self.mlp = _MLP(config)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=eps)

    def forward(self, embeds, hidden, cos, sin, cache: FeatureHeadCache) -> torch.Tensor:
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)
        hidden = residual + self.self_attn(x, cos, sin, cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class FeatureHead(nn.Module):
    """The draft head (formulas in the module docstring). Tensor names are speculators' (``fc``, ``layers.0.*``,
    ``norm``, ``lm_head``, ``d2t``, ``t2d``, ``input_norm``, ``fc_norm.<i>``), so both saved layouts hold the same
    `state_dict`.

    Args:
        config: the head's shape.
        embedding: the target's input embedding (``target.get_input_embeddings()``, ``(V, H)``). It is shared, not
            copied, and not a submodule: it is not in `state_dict`, and moving the head does not move it.
        dtype, device: of the head's weights (default: the embedding's).

    Example:
        >>> config = FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
        ...                            num_key_value_heads=2, vocab_size=96, draft_vocab_size=96, layer_ids=(1,))
        >>> head = FeatureHead(config, torch.nn.Embedding(96, 32))
        >>> tokens, logits = head.draft(torch.randn(1, 5, 32), torch.randint(96, (1, 5)), 3, cache=head.new_cache())
        >>> tokens.shape, logits.shape
        (torch.Size([1, 3]), torch.Size([1, 3, 96]))
    """

    def __init__(
        self,
        config: FeatureHeadConfig,
        embedding: nn.Embedding,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        weight = getattr(embedding, "weight", None)
        if (
            not isinstance(embedding, nn.Module)
            or weight is None
            or tuple(weight.shape)
            != (
                config.vocab_size,
                config.hidden_size,
            )
        ):
            raise InvalidPoolError(
                f"`embedding` must be the target's input embedding of shape ({config.vocab_size}, "
                f"{config.hidden_size}), but is {type(embedding).__name__} of shape "
                f"{None if weight is None else tuple(weight.shape)}. Pass `target.get_input_embeddings()`."
            )
        self.config = config
        self._shared = (embedding,)  # a tuple: not registered as a submodule
        hidden = config.hidden_size
        if config.norm_before_fc:
            self.input_norm = LlamaRMSNorm(config.fc_in_features, eps=config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList([LlamaRMSNorm(hidden, eps=config.rms_norm_eps) for _ in config.layer_ids])
        self.fc = nn.Linear(config.fc_in_features, hidden, bias=config.fc_bias)
        self.layers = nn.ModuleList([_DecoderLayer(config)])
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        self.rotary_emb = _rotary(config)
        self.to(device=weight.device if device is None else device)
        for child in self.children():
            if child is not self.rotary_emb:
                child.to(dtype=weight.dtype if dtype is None else dtype)

    @property
    def embedding(self) -> nn.Embedding:
        """The target's input embedding (shared)."""
        return self._shared[0]

    def base_state_dict(self) -> dict[str, torch.Tensor]:
        """The `state_dict` of the head without its adapters (`hf_metasd.feature_head.adapters`): the names and
        tensors of a head that never had any (peft's ``<module>.base_layer.*`` unwrapped, adapter weights left out).
        Both layouts save this."""
        wrapped = [name for name, module in self.named_modules() if name and hasattr(module, "base_layer")]
        state = {}
        for key, tensor in self.state_dict().items():
            owner = next((name for name in wrapped if key.startswith(f"{name}.")), None)
            if owner is None:
                state[key] = tensor
            elif key.startswith(f"{owner}.base_layer."):
                state[f"{owner}.{key.removeprefix(f'{owner}.base_layer.')}"] = tensor
        return state

    def new_cache(self) -> FeatureHeadCache:
        """An empty cache for one sequence."""
        return FeatureHeadCache()

    def set_vocab_map(self, target_ids: Any) -> None:
        """Make the draft vocabulary the target tokens `target_ids` (``Vd`` of them, in draft-id order)."""
        d2t, t2d = vocab_map(target_ids, self.config.vocab_size)
        if d2t.numel() != self.config.draft_vocab_size:
            raise InvalidPoolError(
                f"`target_ids` must hold draft_vocab_size = {self.config.draft_vocab_size} ids, but holds "
                f"{d2t.numel()}. Pass one target id per draft id."
            )
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    # ------------------------------------------------------------------ maths
    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """``g = fc(input_norm(f))``, or with `fc_norm` ``fc`` of each layer's features normed apart:
        ``(B, T, k H) -> (B, T, H)``."""
        if features.dim() != 3 or features.shape[-1] != self.config.fc_in_features:
            raise MetaSDConfigError(
                f"`features` must have shape (B, T, {self.config.fc_in_features}) (the target's layers "
                f"{list(self.config.layer_ids)} concatenated), but has {tuple(features.shape)}. Record them with "
                "`FeatureRecorder(target, head.config.layer_ids)`."
            )
        features = features.to(self.fc.weight.dtype)
        if self.config.norm_before_fc:
            features = self.input_norm(features)
        if self.config.fc_norm:
            chunks = features.split(self.config.hidden_size, dim=-1)
            features = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(features)

    def forward(
        self, hidden: torch.Tensor, input_ids: torch.LongTensor, cache: FeatureHeadCache
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``T`` entries to `cache`: `hidden` ``(B, T, H)`` (``g``, or what an earlier call returned) paired
        with the target ids `input_ids` ``(B, T)`` that follow. Returns draft-vocabulary logits ``z`` ``(B, T, Vd)``
        and what the next drafting step feeds back, ``(B, T, H)``: the layer's outputs ``o`` (before `norm`), or
        ``norm(o)`` with `norm_output`."""
        embeds = self.embedding(input_ids).to(hidden.dtype)
        positions = cache.length + 1 + torch.arange(input_ids.shape[1], device=input_ids.device)
        cos, sin = self.rotary_emb(embeds, positions.expand(input_ids.shape[0], -1))
        out = self.layers[0](embeds, hidden, cos, sin, cache)
        normed = self.norm(out)
        return self.lm_head(normed), normed if self.config.norm_output else out

    def draft_to_target(self, draft_ids: torch.LongTensor) -> torch.LongTensor:
        """Target ids of draft ids: ``d + d2t[d]``."""
        return draft_ids + self.d2t[draft_ids]

    def in_draft_vocab(self, target_ids: torch.LongTensor) -> torch.BoolTensor:
        """``t2d[t]``: whether each target id has a draft id."""
        return self.t2d[target_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits ``(..., Vd)`` as target-vocabulary logits ``(..., V)``: ``-inf`` outside the
        draft vocabulary."""
        out = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        out[..., self.draft_to_target(torch.arange(logits.shape[-1], device=logits.device))] = logits
        return out

    # ------------------------------------------------------------------ drafting
    @torch.no_grad()
    def draft(
        self,
        features: torch.Tensor,
        next_ids: torch.LongTensor,
        num_tokens: int,
        *,
        cache: FeatureHeadCache,
        start: int | None = None,
        input_ids: torch.LongTensor | None = None,
        logits_processor: Callable[[torch.LongTensor, torch.Tensor], torch.Tensor] | None = None,
        do_sample: bool = False,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.LongTensor, torch.Tensor]:
        """Draft `num_tokens` tokens after the target features of new positions ``start .. start + T - 1``.

        Args:
            features: ``(B, T, k H)``, the target's features at those positions (accepted tokens only).
            next_ids: ``(B, T)``, the token after each of those positions; the last one is the newest token.
            cache: this sequence's cache. Its entries from ``start`` on are dropped first (rollback).
            start: the position of ``features[:, 0]`` (default ``cache.committed``: the entries kept so far).
            input_ids, logits_processor: when given, each step's target-vocabulary logits pass through
                ``logits_processor(input_ids + drafted so far, logits)`` (transformers' processors).
            do_sample: sample each token from the softmax of those logits (else argmax); `generator` seeds it.

        Returns:
            target ids ``(B, num_tokens)`` and the (processed) target-vocabulary logits ``(B, num_tokens, V)`` they
            were chosen from. A step whose processed logits are no distribution in some row (every entry ``-inf``,
            a NaN) ends the draft before its token, so fewer than `num_tokens` (possibly none) come back.
        """
        batch, new = next_ids.shape if next_ids.dim() == 2 else (None, None)
        if batch is None or features.shape[:2] != (batch, new) or new < 1:
            raise MetaSDConfigError(
                f"`next_ids` must have shape (B, T) with T >= 1 and `features` (B, T, kH), but they have "
                f"{tuple(next_ids.shape)} and {tuple(features.shape)}. Pass one next token per feature position."
            )
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise MetaSDTypeError(f"`num_tokens` must be an int >= 1, but is {num_tokens!r}. Pass e.g. 3.")
        start = cache.committed if start is None else start
        if not isinstance(start, int) or isinstance(start, bool) or not 0 <= start <= cache.committed:
            raise MetaSDConfigError(
                f"`start` must be an int in [0, {cache.committed}] (the entries made from target features), but is "
                f"{start!r}. Pass the features of every position from `cache.committed` on."
            )
        if logits_processor is not None and input_ids is None:
            raise MetaSDConfigError("`input_ids` must be given with `logits_processor`, but is None. Pass them.")
        cache.crop(start)
        logits, hidden = self(self.fuse(features), next_ids, cache)
        cache.committed = cache.length
        context, tokens, scores = input_ids, [], []
        for step in range(num_tokens):
            step_scores = self.to_target_logits(logits[:, -1].float())
            if logits_processor is not None:
                step_scores = logits_processor(context, step_scores)
            # a step whose processed logits are no distribution in some row (a processor masked the whole draft
            # vocabulary, NaN weights) ends the draft before its token: the caller abstains on an empty draft
            if not bool(torch.isfinite(step_scores.amax(-1)).all()):
                break
            if do_sample:
                token = torch.multinomial(step_scores.softmax(-1), 1, generator=generator).squeeze(1)
            else:
                token = step_scores.argmax(-1)
            tokens.append(token)
            scores.append(step_scores)
            if context is not None:
                context = torch.cat([context, token[:, None]], dim=1)
            if step + 1 < num_tokens:
                logits, hidden = self(hidden[:, -1:], token[:, None], cache)
        if not tokens:  # not one step had a distribution
            return next_ids[:, :0], step_scores.new_empty(step_scores.shape[0], 0, step_scores.shape[-1])
        return torch.stack(tokens, dim=1), torch.stack(scores, dim=1)


def _rotary(config: FeatureHeadConfig) -> LlamaRotaryEmbedding:
    """transformers' Llama rotary embedding for the head's ``head_dim`` and ``rope_parameters`` (every rope type)."""
    heads = config.num_attention_heads
    try:
        llama = LlamaConfig(
            hidden_size=heads * config.head_dim,
            num_attention_heads=heads,
            head_dim=config.head_dim,
            rope_parameters=dict(config.rope_parameters),
            max_position_embeddings=config.max_position_embeddings,
        )
        rotary = LlamaRotaryEmbedding(llama)
    except (ValueError, TypeError, KeyError, ArithmeticError) as err:
        raise InvalidPoolError(
            f"`rope_parameters` must be rotary settings transformers' Llama accepts, but "
            f"{config.rope_parameters!r} is refused ({type(err).__name__}: {err}). Fix `rope_parameters`."
        ) from err
    finite = rotary.inv_freq.device.type == "meta" or bool(torch.isfinite(rotary.inv_freq).all())  # meta: shapes only
    if not finite or not math.isfinite(rotary.attention_scaling):
        raise InvalidPoolError(
            f"`rope_parameters` must give finite rotary frequencies, but {config.rope_parameters!r} gives non-finite "
            "ones. Fix `rope_parameters`."
        )
    return rotary
