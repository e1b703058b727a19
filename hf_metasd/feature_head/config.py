"""`FeatureHeadConfig`: the shape of an EAGLE-3-style feature head, saved as sorted JSON, and its checks.

A feature head drafts from the **target's own hidden features**: the residual stream at ``k`` chosen target layers
(`layer_ids`), fused by one linear map, plus the target's embedding of the next token, through one Llama-style
decoder layer and an LM head over a draft vocabulary of ``Vd <= V`` tokens (`hf_metasd.feature_head.head` has the
formulas). This module holds only the numbers that fix the head's tensors, and their ranges: every field is checked
(`FeatureHeadConfig.validate`) when a config is built, saved or read, and `check_target` checks it against the target
it drafts for, so that a head never meets a target it does not fit.

Layer ids follow vLLM / speculators (EAGLE-3): id ``i`` in ``[0, L]`` is the **input** of target decoder layer ``i``
(the output of layer ``i - 1``; id 0 is the token embeddings) and id ``L`` is the input of the target's final norm
(its last layer's output, before that norm). For ``i < L`` this is transformers' ``output_hidden_states[i]``;
transformers' ``output_hidden_states[L]`` is *after* the final norm, id ``L`` is not.
"""

from __future__ import annotations

import json
import math
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from typing import Any

from ..errors import InvalidPoolError, InvalidPoolTypeError

__all__ = [
    "MAX_DIM",
    "MAX_LAYER_IDS",
    "MAX_ROPE_FACTOR",
    "MAX_ROPE_THETA",
    "FeatureHeadConfig",
    "default_layer_ids",
    "target_shape",
]

#: Largest width, vocabulary or layer id a config may hold (bounds what a config read from a file can allocate).
MAX_DIM = 2**20
#: Most target layers a head may fuse.
MAX_LAYER_IDS = 16
#: Activations the head's MLP may use (names of ``transformers.activations.ACT2FN``).
ACTIVATIONS = ("gelu", "gelu_pytorch_tanh", "relu", "silu")
_FLAGS = ("attention_bias", "mlp_bias", "fc_bias", "norm_before_fc", "norm_before_residual", "fc_norm", "norm_output")
_FIX = "Fix the value, or rebuild the config with `FeatureHeadConfig.for_target(target)`."
#: Largest `rope_theta` a config may hold (Llama 3's is 500,000).
MAX_ROPE_THETA = 1e12
#: Largest scaling number (`factor`, `low_freq_factor`, `beta_fast`, ...) a config's `rope_parameters` may hold.
MAX_ROPE_FACTOR = 1e6
#: The range of each number of `rope_parameters` that transformers' rotary embeddings divide by or scale with,
#: wherever it appears: ``(low, low_included, high)`` (a bound `high` included). `factor` divides the inverse
#: frequencies (and transformers asks for >= 1); llama3 divides the original context by `low_freq_factor` and
#: `high_freq_factor`; yarn divides by `beta_fast` / `beta_slow` inside a logarithm, and by ``1 + 0.1 * mscale_all_dim *
#: log(factor)``, which `mscale*` >= 0 keeps >= 1; longrope divides by each of `short_factor` / `long_factor` and by
#: ``log(original_max_position_embeddings)``.
_ROPE_RANGES: dict[str, tuple[float, bool, float]] = {
    "factor": (1.0, True, MAX_ROPE_FACTOR),
    "low_freq_factor": (0.0, False, MAX_ROPE_FACTOR),
    "high_freq_factor": (0.0, False, MAX_ROPE_FACTOR),
    "attention_factor": (0.0, False, MAX_ROPE_FACTOR),
    "beta_fast": (0.0, False, MAX_ROPE_FACTOR),
    "beta_slow": (0.0, False, MAX_ROPE_FACTOR),
    "mscale": (0.0, True, MAX_ROPE_FACTOR),
    "mscale_all_dim": (0.0, True, MAX_ROPE_FACTOR),
    "partial_rotary_factor": (0.0, False, 1.0),
    "short_factor": (0.0, False, MAX_ROPE_FACTOR),
    "long_factor": (0.0, False, MAX_ROPE_FACTOR),
}


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's default feature layers of an `num_layers`-layer target: low, middle and high, ``(2, L // 2, L - 3)``
    (what speculators and vLLM use when a head names none).

    Example:
        >>> default_layer_ids(32)
        (2, 16, 29)
        >>> default_layer_ids(4)
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: `layer_ids` must be given for a target of 4 layers: the default (2, L // 2, L - 3) needs 7 layers or more. Pass e.g. `layer_ids=(4,)` (the top layer, EAGLE-1 style).
    """
    ids = (2, num_layers // 2, num_layers - 3)
    if num_layers < 7:
        raise InvalidPoolError(
            f"`layer_ids` must be given for a target of {num_layers} layers: the default (2, L // 2, L - 3) needs 7 "
            f"layers or more. Pass e.g. `layer_ids=({num_layers},)` (the top layer, EAGLE-1 style)."
        )
    return ids


def target_shape(target: Any) -> tuple[int, int, int]:
    """``(hidden_size, vocab_size, num_layers)`` of a Llama-family `target` (read from its input embedding and
    ``target.model.layers``), or `InvalidPoolError` if it has no such parts."""
    inner = getattr(target, "model", None)
    layers = getattr(inner, "layers", None)
    embedding = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
    weight = getattr(embedding, "weight", None)
    if layers is None or getattr(inner, "norm", None) is None or weight is None or weight.dim() != 2:
        raise InvalidPoolError(
            f"`target` must be a Llama-family causal LM (`target.model.layers`, `target.model.norm`, an input "
            f"embedding), but is {type(target).__name__}. Use a feature head with a Llama-family target."
        )
    return int(weight.shape[1]), int(weight.shape[0]), len(layers)


@dataclass(frozen=True)
class FeatureHeadConfig:
    """The numbers that fix a feature head's tensors (``H`` hidden, ``V`` target vocabulary, ``Vd`` draft vocabulary,
    ``k`` fused layers).

    Attributes:
        hidden_size: ``H``, the target's hidden size (the head shares the target's embedding, so it has the same).
        intermediate_size: width of the head's MLP.
        num_attention_heads, num_key_value_heads, head_dim: the head's attention (``head_dim`` defaults to
            ``H // num_attention_heads``).
        vocab_size: ``V``, the target's vocabulary (the embedding's rows, the width of target-vocabulary logits).
        draft_vocab_size: ``Vd <= V``, the LM head's rows; ``d2t`` / ``t2d`` map them to target ids.
        layer_ids: the ``k`` target layers whose features are fused (see the module docstring); ``fc`` maps
            ``k * H -> H``.
        rms_norm_eps, rope_parameters, max_position_embeddings, hidden_act, attention_bias, mlp_bias: as in
            transformers' ``LlamaConfig`` (``rope_parameters`` holds ``rope_type`` and ``rope_theta``).
        fc_bias: whether ``fc`` has a bias (early speculators heads).
        norm_before_fc: an RMSNorm over the ``k * H`` features before ``fc`` (``input_norm``; gpt-oss heads).
        fc_norm: an RMSNorm over each fused layer's ``H`` features before ``fc`` (``fc_norm.<i>``, one per layer
            id, in `layer_ids` order; speculators' ``fc_norm``). Not with `norm_before_fc`.
        norm_output: drafting steps after the first feed the head's *normed* output ``norm(o)`` back, not ``o``
            (speculators' ``norm_output``, "EAGLE 3.1"; the logits are the same either way).
        norm_before_residual: the residual of the decoder layer is the *normed* fused feature (speculators'
            ``norm_before_residual``).

    Example:
        >>> config = FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4,
        ...                            num_key_value_heads=2, vocab_size=96, draft_vocab_size=48, layer_ids=(2, 4, 5))
        >>> config.head_dim, config.fc_in_features
        (8, 96)
        >>> FeatureHeadConfig.from_json(config.to_json()) == config
        True
        >>> config.to_json().splitlines()[1:4]
        ['  "attention_bias": false,', '  "draft_vocab_size": 48,', '  "fc_bias": false,']
        >>> FeatureHeadConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        ...                   vocab_size=96, draft_vocab_size=128, layer_ids=(1,))
        Traceback (most recent call last):
        ...
        hf_metasd.errors.InvalidPoolError: `draft_vocab_size` must be an int in [1, vocab_size = 96], but is 128. Fix the value, or rebuild the config with `FeatureHeadConfig.for_target(target)`.
    """

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    draft_vocab_size: int
    layer_ids: tuple[int, ...]
    head_dim: int | None = None
    rms_norm_eps: float = 1e-6
    rope_parameters: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    max_position_embeddings: int = 2048
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    fc_bias: bool = False
    norm_before_fc: bool = False
    norm_before_residual: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.layer_ids, list):
            object.__setattr__(self, "layer_ids", tuple(self.layer_ids))
        heads = self.num_attention_heads
        if self.head_dim is None and _is_int(self.hidden_size) and _is_int(heads) and heads > 0:
            object.__setattr__(self, "head_dim", self.hidden_size // heads)
        self.validate()

    @property
    def fc_in_features(self) -> int:
        """``k * H``: the width of the fused features ``fc`` reads."""
        return len(self.layer_ids) * self.hidden_size

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise `InvalidPoolError` (`InvalidPoolTypeError` for a wrong type) unless every field is in range."""
        for name in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size", "head_dim"):
            _check_int(name, getattr(self, name), 1, MAX_DIM)
        _check_int("max_position_embeddings", self.max_position_embeddings, 1, MAX_DIM * 64)
        _check_int("num_key_value_heads", self.num_key_value_heads, 1, self.num_attention_heads)
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidPoolError(
                f"`num_attention_heads` ({self.num_attention_heads}) must be a multiple of `num_key_value_heads`, "
                f"but `num_key_value_heads` is {self.num_key_value_heads}. {_FIX}"
            )
        _check_int("draft_vocab_size", self.draft_vocab_size, 1, self.vocab_size, high_name="vocab_size")
        if not isinstance(self.layer_ids, tuple) or not 1 <= len(self.layer_ids) <= MAX_LAYER_IDS:
            raise InvalidPoolTypeError(
                f"`layer_ids` must be a list of 1 to {MAX_LAYER_IDS} target layer ids, but is {self.layer_ids!r}. "
                "Pass e.g. `layer_ids=(2, 16, 29)`."
            )
        for i in self.layer_ids:
            _check_int("layer_ids[...]", i, 0, MAX_DIM)
        if len(set(self.layer_ids)) != len(self.layer_ids):
            raise InvalidPoolError(f"`layer_ids` must be distinct, but is {list(self.layer_ids)}. {_FIX}")
        eps = self.rms_norm_eps
        if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (math.isfinite(eps) and 0 < eps < 1):
            raise InvalidPoolError(f"`rms_norm_eps` must be a float in (0, 1), but is {eps!r}. {_FIX}")
        self._validate_rope()
        if self.hidden_act not in ACTIVATIONS:
            raise InvalidPoolError(f"`hidden_act` must be one of {list(ACTIVATIONS)}, but is {self.hidden_act!r}.")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise InvalidPoolTypeError(f"`{name}` must be a bool, but is {getattr(self, name)!r}. {_FIX}")
        if self.norm_before_fc and self.fc_norm:
            raise InvalidPoolError(
                "`norm_before_fc` and `fc_norm` must not both be true (one norm over all fused features, or one per "
                "fused layer, as speculators allows), but both are. Keep the one the head was trained with."
            )

    def _validate_rope(self) -> None:
        rope = self.rope_parameters
        if not isinstance(rope, dict) or not isinstance(rope.get("rope_type"), str) or len(rope) > 32:
            raise InvalidPoolTypeError(
                f"`rope_parameters` must be a dict with a string `rope_type`, but is {rope!r}. {_FIX}"
            )
        theta = rope.get("rope_theta")
        if not isinstance(theta, (int, float)) or isinstance(theta, bool) or not (math.isfinite(theta) and theta > 0):
            raise InvalidPoolError(f"`rope_parameters['rope_theta']` must be a float > 0, but is {theta!r}. {_FIX}")
        if theta > MAX_ROPE_THETA:
            raise InvalidPoolError(
                f"`rope_parameters['rope_theta']` must be at most {MAX_ROPE_THETA:.0f}, but is {theta!r}. {_FIX}"
            )
        for key, value in rope.items():
            scalar = value is None or isinstance(value, (str, int, float))
            if not isinstance(key, str) or not (scalar or _is_number_list(value)):
                raise InvalidPoolTypeError(
                    f"`rope_parameters` must map names to numbers or strings, but {key!r} is {value!r}. {_FIX}"
                )
            numbers = value if isinstance(value, list) else [value]
            if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
                raise InvalidPoolError(
                    f"`rope_parameters[{key!r}]` must hold finite numbers, but is {value!r}. {_FIX}"
                )
            if key in _ROPE_RANGES and value is not None:
                _check_rope_range(key, value)
        self._validate_rope_scaling(rope)

    def _validate_rope_scaling(self, rope: dict[str, Any]) -> None:
        """What one rope type divides by besides the ranges of `_ROPE_RANGES` (transformers only warns, then
        divides by zero or computes non-finite frequencies)."""
        kind = rope["rope_type"]
        share = rope.get("partial_rotary_factor")
        rotary = int(self.head_dim * (share if _is_number(share) else 1.0))  # the rotated dims of a head
        original = rope.get("original_max_position_embeddings")
        if original is not None:
            _check_int("rope_parameters['original_max_position_embeddings']", original, 2, MAX_DIM * 64)
        low, high = rope.get("low_freq_factor"), rope.get("high_freq_factor")
        if kind == "llama3" and _is_number(low) and _is_number(high) and not high > low:
            raise InvalidPoolError(
                f"`rope_parameters['high_freq_factor']` must be greater than `low_freq_factor` (llama3 divides by "
                f"their difference), but is {high!r} with `low_freq_factor` {low!r}. {_FIX}"
            )
        if kind == "yarn" and not rope["rope_theta"] > 1:
            raise InvalidPoolError(
                f"`rope_parameters['rope_theta']` must be greater than 1 for yarn (it divides by its logarithm), but "
                f"is {rope['rope_theta']!r}. {_FIX}"
            )
        if kind == "dynamic" and rotary <= 2:
            raise InvalidPoolError(
                f"the rotated dimensions of a head must be more than 2 for dynamic rope (it divides by their number "
                f"minus 2), but are {rotary} (`head_dim` {self.head_dim} times `partial_rotary_factor`). {_FIX}"
            )
        for key in ("short_factor", "long_factor"):
            value = rope.get(key)
            if kind == "longrope" and isinstance(value, list) and len(value) != rotary // 2:
                raise InvalidPoolError(
                    f"`rope_parameters[{key!r}]` must hold one number per rotated pair of a head's dimensions "
                    f"({rotary // 2}), but holds {len(value)}. {_FIX}"
                )

    def check_target(self, target: Any, where: str = "the feature head") -> None:
        """Raise `InvalidPoolError` unless this head fits `target`: same hidden size and vocabulary, layer ids in
        ``[0, L]`` for an ``L``-layer target."""
        hidden, vocab, layers = target_shape(target)
        fix = "Load the head with the target it was trained for."
        if self.hidden_size != hidden:
            raise InvalidPoolError(
                f"`hidden_size` of {where} must be the target's hidden size {hidden}, but is {self.hidden_size}. {fix}"
            )
        if self.vocab_size != vocab:
            raise InvalidPoolError(
                f"`vocab_size` of {where} must be the target's vocabulary size {vocab}, but is {self.vocab_size}. "
                f"{fix}"
            )
        if max(self.layer_ids) > layers:
            raise InvalidPoolError(
                f"`layer_ids` of {where} must be in [0, {layers}] for a target of {layers} layers, but is "
                f"{list(self.layer_ids)}. {fix}"
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def for_target(
        cls, target: Any, *, layer_ids: Any = None, draft_vocab_size: int | None = None, **overrides: Any
    ) -> FeatureHeadConfig:
        """A config shaped for `target` (its hidden size, vocabulary, attention and rotary settings), fusing
        `layer_ids` (default `default_layer_ids`) into a head over `draft_vocab_size` tokens (default ``V``);
        `overrides` set any other field (e.g. ``intermediate_size``)."""
        hidden, vocab, layers = target_shape(target)
        text = target.config.get_text_config() if hasattr(target.config, "get_text_config") else target.config
        values: dict[str, Any] = {
            "hidden_size": hidden,
            "vocab_size": vocab,
            "draft_vocab_size": vocab if draft_vocab_size is None else draft_vocab_size,
            "layer_ids": tuple(default_layer_ids(layers) if layer_ids is None else layer_ids),
        }
        for name in ("intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"):
            values[name] = getattr(text, name, None)
        for name in ("max_position_embeddings", "hidden_act", "attention_bias", "mlp_bias"):
            if getattr(text, name, None) is not None:
                values[name] = getattr(text, name)
        if isinstance(getattr(text, "rope_parameters", None), dict):
            values["rope_parameters"] = dict(text.rope_parameters)
        values.update(overrides)
        return cls(**values)

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["layer_ids"] = list(self.layer_ids)
        return data

    def to_json(self) -> str:
        """Sorted, indented JSON (the file `hf_metasd.feature_head.io` writes)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = "the feature head config") -> FeatureHeadConfig:
        """The config of parsed JSON `data`. Keys this version does not know (written by a newer hf_metasd) are
        dropped with **one** warning naming them; a missing field or a bad value raises `InvalidPoolError`."""
        if not isinstance(data, dict):
            raise InvalidPoolTypeError(f"{where} must be a JSON object, but is {type(data).__name__}. {_FIX}")
        missing = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in missing if name not in data]
        if missing:
            raise InvalidPoolError(f"{where} must set every required field, but lacks {missing}. {_FIX}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in data if key not in known)
        if unknown:
            warnings.warn(
                f"{where} has keys this hf_metasd version does not know, ignored: {unknown}. Upgrade hf_metasd to "
                "use them.",
                UserWarning,
                stacklevel=2,
            )
        return cls(**{key: value for key, value in data.items() if key in known})

    @classmethod
    def from_json(cls, text: str, where: str = "the feature head config") -> FeatureHeadConfig:
        return cls.from_dict(json.loads(text), where)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 1024 and all(isinstance(v, (int, float)) for v in value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_rope_range(key: str, value: Any) -> None:
    """`value` (a number, or a list of numbers for `short_factor` / `long_factor`) in ``_ROPE_RANGES[key]``."""
    low, closed, high = _ROPE_RANGES[key]
    numbers = value if isinstance(value, list) else [value]
    interval = f"{'[' if closed else '('}{low:.0f}, {high:.0f}]"
    if not all(_is_number(v) for v in numbers):
        raise InvalidPoolTypeError(
            f"`rope_parameters[{key!r}]` must be a number in {interval}, but is {value!r}. {_FIX}"
        )
    if not all((v >= low if closed else v > low) and v <= high for v in numbers):
        what = "hold numbers" if isinstance(value, list) else "be a number"
        raise InvalidPoolError(f"`rope_parameters[{key!r}]` must {what} in {interval}, but is {value!r}. {_FIX}")


def _check_int(name: str, value: Any, low: int, high: int, high_name: str | None = None) -> None:
    if not _is_int(value) or not low <= value <= high:
        bound = high if high_name is None else f"{high_name} = {high}"
        error = InvalidPoolError if _is_int(value) else InvalidPoolTypeError
        raise error(f"`{name}` must be an int in [{low}, {bound}], but is {value!r}. {_FIX}")
