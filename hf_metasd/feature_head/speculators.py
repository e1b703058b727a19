"""speculators' EAGLE-3 layout: the format `speculators` (`vllm-project/speculators`) trains EAGLE-3 heads in and vLLM
serves them from.

Read from speculators' own source (``src/speculators/models/eagle3/{config,core,model_definitions}.py``,
``model.py`` (``DraftVocabMixin``), ``config.py``; version 0.9) and vLLM's loader
(``vllm/model_executor/models/llama_eagle3.py``, ``vllm/transformers_utils/configs/speculators/{base,algos}.py``,
and the target's capture loop in ``llama.py``). Only the layout is shared; the code here is hf_metasd's own and does
not import speculators (``tests/test_feature_head_speculators.py`` checks both directions against speculators' own
classes when it is installed).

SGLang does **not** serve this layout: its EAGLE-3 loader (``sglang/srt/models/llama_eagle3.py``) reads EAGLE's
original layout (``architectures: ["LlamaForCausalLMEagle3"]``, a flat Llama config, the decoder layer's tensors
named ``midlayer.*``; SpecForge writes it) and skips ``layers.0.*`` tensors without an error. hf_metasd reads and
writes neither that layout nor SGLang's: a folder in it is refused by name; ``speculators convert FOLDER --algorithm
eagle3 --verifier TARGET`` turns it into this layout, which then loads.

A folder holds ``config.json`` and ``model.safetensors`` (or shards with ``model.safetensors.index.json``):

* ``config.json``: ``speculators_model_type: "eagle3"``; ``architectures`` (``["Eagle3Speculator"]``; speculators
  0.9 writes ``["Eagle3DraftModel"]``); ``transformer_layer_config``: a Llama config of the single decoder layer, as
  ``LlamaConfig.to_diff_dict()`` writes it (a key left out has `LLAMA_DEFAULTS`'s value; ``num_hidden_layers: 1``);
  ``draft_vocab_size``; ``norm_before_residual``; ``norm_before_fc``; ``fc_norm``; ``norm_output``;
  ``target_hidden_size`` (``null``: the target's is the head's); ``eagle_aux_hidden_state_layer_ids`` (the fused
  target layers, EAGLE-3 ids; ``null`` -> ``(2, L // 2, L - 3)``); ``embed_requires_grad``; ``speculators_config``:
  ``{"algorithm": "eagle3", "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": n,
  "verifier_accept_k": 1, "accept_tolerance": 0.0}], "default_proposal_method": "greedy", "verifier":
  {"name_or_path": ..., "architectures": [...]}}``.
* tensors: ``fc.weight`` ``(H, k H)`` (``fc.bias`` in early heads), ``layers.0.self_attn.{q,k,v}_proj.weight``
  ``(heads * head_dim, 2 H)``, ``layers.0.self_attn.o_proj.weight``, ``layers.0.mlp.{gate,up,down}_proj.weight``,
  ``layers.0.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``, ``norm.weight``, ``lm_head.weight``
  ``(Vd, H)``, ``d2t`` int64 ``(Vd,)`` (offsets: target id = ``d + d2t[d]``), ``t2d`` bool ``(V,)``;
  ``input_norm.weight`` ``(k H,)`` with ``norm_before_fc``; ``fc_norm.<i>.weight`` ``(H,)``, ``i < k``, with
  ``fc_norm``; ``embed_tokens.weight`` ``(V, H)`` (a frozen copy of the target's embedding; optional: vLLM and
  speculators take the target's when it is absent). ``d2t`` / ``t2d`` are absent when ``Vd == V`` (newer
  speculators).

What the flags mean (speculators' ``Eagle3DraftModel.forward``, vLLM's ``combine_hidden_states`` and ``forward``):
``norm_before_fc`` is one RMSNorm over the ``k H`` fused features before ``fc``; ``fc_norm`` one RMSNorm per fused
layer (not with ``norm_before_fc``); ``norm_output`` feeds ``norm(o)`` rather than ``o`` back at drafting steps after
the first (`hf_metasd.feature_head.head`). All three load and save.

**Layer order.** ``fc`` reads the fused features in **ascending** layer-id order, whatever the order of
``eagle_aux_hidden_state_layer_ids``: vLLM's target appends each listed layer's features as its decoder loop passes
that layer, and speculators trains on features vLLM captured. A load therefore sorts the ids (``fc``'s columns and
the ``fc_norm`` / ``input_norm`` weights stay as stored); `save_speculators` writes a head whose `layer_ids` are not
ascending with those columns and weights permuted to ascending order, which computes the same.

Differences between readers that a file must not leave open are refused rather than guessed: a missing
``norm_before_residual`` (speculators defaults it to false, vLLM to true), a missing ``draft_vocab_size``
(speculators: 32000, vLLM: ``V``), ``embed_requires_grad: true`` (a trained embedding: this head shares the
target's), ``target_hidden_size`` other than the hidden size, a ``transformer_layer_config`` other than a one-layer
Llama, ``norm_before_fc`` with ``fc_norm``. A top-level key this module does not know is named in one warning (a newer
speculators' flag may change the head's maths). `save_speculators` refuses what vLLM cannot load: a head fusing other
than 3 layers (vLLM's reader builds ``fc`` over ``3 H`` features), unless ``for_vllm=False``.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..errors import InvalidPoolError, InvalidPoolTypeError
from .config import FeatureHeadConfig, default_layer_ids, target_shape
from .head import FeatureHead
from .io import expected_state, load_state, new_head, read_json, read_tensors, tensor_names, weight_files

__all__ = [
    "KNOWN_KEYS",
    "LLAMA_DEFAULTS",
    "VLLM_FUSED_LAYERS",
    "WEIGHTS_NAME",
    "ascending_state",
    "check_layout",
    "check_vllm",
    "config_from_speculators",
    "load_speculators",
    "save_speculators",
]

WEIGHTS_NAME = "model.safetensors"
#: transformers' ``LlamaConfig`` defaults: ``to_diff_dict`` leaves out a value equal to them, so that is what a
#: missing key of ``transformer_layer_config`` means.
LLAMA_DEFAULTS: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "mlp_bias": False,
}
_FIX = "Use an EAGLE-3 head saved by speculators (or `save_speculators`) for this target."
#: How many target layers vLLM's EAGLE-3 reader fuses (``fc`` over ``3 * target_hidden_size`` features).
VLLM_FUSED_LAYERS = 3
#: The top-level ``config.json`` keys of speculators' EAGLE-3 config, and the metadata transformers and speculators
#: add; any other key is named in a warning.
KNOWN_KEYS = frozenset(
    {
        "architectures",
        "auto_map",
        "chunk_size_feed_forward",
        "draft_vocab_size",
        "dtype",
        "eagle_aux_hidden_state_layer_ids",
        "embed_requires_grad",
        "fc_norm",
        "has_no_defaults_at_init",
        "id2label",
        "is_encoder_decoder",
        "label2id",
        "model_type",
        "norm_before_fc",
        "norm_before_residual",
        "norm_output",
        "output_attentions",
        "output_hidden_states",
        "problem_type",
        "return_dict",
        "speculators_config",
        "speculators_model_type",
        "speculators_version",
        "target_hidden_size",
        "tie_word_embeddings",
        "torch_dtype",
        "transformer_layer_config",
        "transformers_version",
    }
)


def config_from_speculators(data: Any, target: Any, *, fc_bias: bool = False, where: str = "config.json"):
    """The `FeatureHeadConfig` of a speculators EAGLE-3 ``config.json`` (parsed), checked against `target`.

    `fc_bias` says whether the weights hold ``fc.bias`` (the config does not say). Raises `InvalidPoolError` for
    anything the head cannot serve (module docstring)."""
    check_layout(data, where)
    unknown = sorted(str(key) for key in data if key not in KNOWN_KEYS and not str(key).startswith("_"))
    if unknown:
        warnings.warn(
            f"{where} has keys this hf_metasd version does not know, ignored: {unknown}. If one changes the head's "
            "maths, its drafts are wrong: upgrade hf_metasd to use them.",
            UserWarning,
            stacklevel=2,
        )
    layer = data.get("transformer_layer_config", {})
    if not isinstance(layer, dict):
        raise InvalidPoolTypeError(f"`transformer_layer_config` in {where} must be an object, but is {layer!r}.")
    if layer.get("model_type", "llama") != "llama":
        raise InvalidPoolError(
            f'`transformer_layer_config.model_type` in {where} must be "llama" (a Llama-style layer), but is '
            f"{layer['model_type']!r}. Use a Llama-style EAGLE-3 head."
        )
    llama = {key: layer.get(key, default) for key, default in LLAMA_DEFAULTS.items()}
    if llama["num_hidden_layers"] != 1:
        raise InvalidPoolError(
            f"`transformer_layer_config.num_hidden_layers` in {where} must be 1 (one decoder layer), but is "
            f"{llama['num_hidden_layers']!r}. Use a single-layer EAGLE-3 head."
        )
    for key in ("norm_before_residual", "draft_vocab_size"):
        if key not in data:
            raise InvalidPoolError(
                f"{where} must set `{key}` (speculators and vLLM default it differently), but does not. Add it."
            )
    if data.get("embed_requires_grad", False) is not False:
        raise InvalidPoolError(
            f"`embed_requires_grad` in {where} must be false (the head shares the target's embedding), but is "
            f"{data['embed_requires_grad']!r}: the head was trained with its own embedding. {_FIX}"
        )
    if data.get("target_hidden_size") not in (None, llama["hidden_size"]):
        raise InvalidPoolError(
            f"`target_hidden_size` in {where} must be null or the head's hidden size {llama['hidden_size']}, but is "
            f"{data['target_hidden_size']!r}. {_FIX}"
        )
    hidden, _, num_layers = target_shape(target)
    if llama["hidden_size"] != hidden:  # the clearest message for the commonest mistake, before any shape
        raise InvalidPoolError(
            f"`transformer_layer_config.hidden_size` in {where} must be the target's hidden size {hidden}, but is "
            f"{llama['hidden_size']!r}. Load the head with the target it was trained for."
        )
    layer_ids = data.get("eagle_aux_hidden_state_layer_ids")
    if layer_ids is None:
        layer_ids = default_layer_ids(num_layers)
        warnings.warn(
            f"{where} names no `eagle_aux_hidden_state_layer_ids`; using EAGLE-3's default {list(layer_ids)} for a "
            f"{num_layers}-layer target, as speculators and vLLM do. Set them if the head was trained on others.",
            UserWarning,
            stacklevel=2,
        )
    if isinstance(layer_ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in layer_ids):
        layer_ids = sorted(layer_ids)  # fc reads them in layer order, as vLLM captures them (module docstring)
    heads = llama["num_attention_heads"]
    return FeatureHeadConfig(
        hidden_size=llama["hidden_size"],
        intermediate_size=llama["intermediate_size"],
        num_attention_heads=heads,
        num_key_value_heads=heads if llama["num_key_value_heads"] is None else llama["num_key_value_heads"],
        head_dim=llama["head_dim"],
        vocab_size=llama["vocab_size"],
        draft_vocab_size=data["draft_vocab_size"],
        layer_ids=tuple(layer_ids) if isinstance(layer_ids, list) else layer_ids,
        rms_norm_eps=llama["rms_norm_eps"],
        rope_parameters=_rope_parameters(layer, where),
        max_position_embeddings=llama["max_position_embeddings"],
        hidden_act=llama["hidden_act"],
        attention_bias=llama["attention_bias"],
        mlp_bias=llama["mlp_bias"],
        fc_bias=fc_bias,
        norm_before_fc=data.get("norm_before_fc", False),
        norm_before_residual=data["norm_before_residual"],
        fc_norm=data.get("fc_norm", False),
        norm_output=data.get("norm_output", False),
    )


def check_layout(data: Any, where: str = "config.json") -> None:
    """Raise `InvalidPoolError` unless the parsed ``config.json`` `data` is speculators' EAGLE-3 layout; EAGLE's
    original layout (SGLang's, SpecForge's: ``LlamaForCausalLMEagle3``, ``midlayer.*``) is named, with the command that
    converts it."""
    if isinstance(data, dict) and data.get("speculators_model_type") == "eagle3":
        return
    found = data.get("speculators_model_type") if isinstance(data, dict) else type(data).__name__
    architectures = data.get("architectures") if isinstance(data, dict) else None
    eagle = (
        [a for a in architectures if isinstance(a, str) and "Eagle3" in a] if isinstance(architectures, list) else []
    )
    if found is None and eagle:
        raise InvalidPoolError(
            f'`speculators_model_type` in {where} must be "eagle3" (speculators\' EAGLE-3 layout), but is missing: the '
            f"architectures {eagle} are EAGLE's original layout (SGLang's and SpecForge's, `midlayer.*` tensors), "
            "which hf_metasd does not read. Convert the folder with `speculators convert FOLDER --algorithm eagle3 "
            "--verifier TARGET` and load the converted folder."
        )
    raise InvalidPoolError(f'`speculators_model_type` in {where} must be "eagle3", but is {found!r}. {_FIX}')


def _rope_parameters(layer: dict[str, Any], where: str) -> dict[str, Any]:
    """transformers 5's ``rope_parameters`` from a layer config with them, or with transformers 4's ``rope_theta`` and
    ``rope_scaling``."""
    if "rope_parameters" in layer:
        rope = layer["rope_parameters"]
        if not isinstance(rope, dict):
            raise InvalidPoolTypeError(f"`rope_parameters` in {where} must be an object, but is {rope!r}.")
        return {"rope_type": "default", **rope}
    scaling = layer.get("rope_scaling") or {}
    if not isinstance(scaling, dict):
        raise InvalidPoolTypeError(f"`rope_scaling` in {where} must be an object or null, but is {scaling!r}.")
    rope = {key: value for key, value in scaling.items() if key != "type"}
    rope["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    rope["rope_theta"] = layer.get("rope_theta", LLAMA_DEFAULTS["rope_theta"])
    return rope


def speculators_config(
    head: FeatureHead,
    *,
    verifier_name_or_path: str | None = None,
    verifier_architectures: list[str] | None = None,
    num_speculative_tokens: int = 3,
    dtype: torch.dtype | None = None,
) -> dict[str, Any]:
    """The ``config.json`` of `head` in speculators' layout (module docstring); its layer ids ascending."""
    config = head.config
    rope = dict(config.rope_parameters)
    theta = rope.pop("rope_theta")
    layer = {
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": config.hidden_act,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        # transformers 4's keys, which transformers 5 still reads (it turns them into `rope_parameters`)
        "rope_theta": theta,
        "rope_scaling": None if rope == {"rope_type": "default"} else rope,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
    }
    method = {"proposal_type": "greedy", "speculative_tokens": num_speculative_tokens, "verifier_accept_k": 1}
    return {
        "architectures": ["Eagle3Speculator"],
        "draft_vocab_size": config.draft_vocab_size,
        "eagle_aux_hidden_state_layer_ids": sorted(config.layer_ids),
        "embed_requires_grad": False,
        "fc_norm": config.fc_norm,
        "norm_before_fc": config.norm_before_fc,
        "norm_before_residual": config.norm_before_residual,
        "norm_output": config.norm_output,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{**method, "accept_tolerance": 0.0}],
            "verifier": {"architectures": list(verifier_architectures or []), "name_or_path": verifier_name_or_path},
        },
        "speculators_model_type": "eagle3",
        "target_hidden_size": None,
        "torch_dtype": str(dtype or head.fc.weight.dtype).removeprefix("torch."),
        "transformer_layer_config": layer,
    }


def ascending_state(head: FeatureHead) -> dict[str, torch.Tensor]:
    """`head`'s weights (`FeatureHead.base_state_dict`, on the CPU) for its layer ids in ascending order: ``fc``'s
    column blocks, ``input_norm``'s blocks and the ``fc_norm.<i>`` permuted to match (the same function of the same
    features, concatenated in layer order). Unchanged when the ids already ascend."""
    config = head.config
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in head.base_state_dict().items()}
    k, hidden = len(config.layer_ids), config.hidden_size
    order = sorted(range(k), key=lambda i: config.layer_ids[i])
    if order == list(range(k)):
        return tensors
    fc = tensors["fc.weight"]
    tensors["fc.weight"] = fc.view(fc.shape[0], k, hidden)[:, order].reshape(fc.shape[0], k * hidden).contiguous()
    if config.norm_before_fc:
        tensors["input_norm.weight"] = tensors["input_norm.weight"].view(k, hidden)[order].reshape(-1).contiguous()
    if config.fc_norm:
        norms = [tensors[f"fc_norm.{i}.weight"] for i in range(k)]
        tensors.update({f"fc_norm.{new}.weight": norms[old] for new, old in enumerate(order)})
    return tensors


def check_vllm(head: FeatureHead) -> None:
    """Raise `InvalidPoolError` if vLLM's EAGLE-3 reader cannot load `head` (module docstring)."""
    layer_ids = list(head.config.layer_ids)
    if len(layer_ids) != VLLM_FUSED_LAYERS:
        raise InvalidPoolError(
            f"`layer_ids` of a head saved in speculators' layout must name {VLLM_FUSED_LAYERS} target layers (vLLM's "
            f"EAGLE-3 reader fuses {VLLM_FUSED_LAYERS}), but names {len(layer_ids)}: {layer_ids}. Train the head on "
            f'{VLLM_FUSED_LAYERS} layers, keep it in hf_metasd\'s layout (`layout="hf_metasd"`), or pass '
            "`for_vllm=False` to write a folder only speculators and hf_metasd load."
        )


def save_speculators(
    head: FeatureHead,
    folder: str | os.PathLike,
    *,
    verifier_name_or_path: str | None = None,
    verifier_architectures: list[str] | None = None,
    num_speculative_tokens: int = 3,
    include_embedding: bool = True,
    for_vllm: bool = True,
) -> None:
    """Write `head` to `folder` in speculators' EAGLE-3 layout, for vLLM and speculators to load (not SGLang: module
    docstring).

    With `for_vllm` (the default) a head vLLM cannot load (`check_vllm`: other than 3 fused layers) is refused before
    anything is written. The layer ids are written ascending, ``fc`` permuted to match (`ascending_state`). ``d2t`` /
    ``t2d`` are written unless the draft vocabulary is the target's in order; with `include_embedding` the shared
    target embedding is written as ``embed_tokens.weight`` (as speculators does; readers take the target's when it is
    absent). The verifier fields and `num_speculative_tokens` only fill speculators' metadata (speculators' own
    ``from_pretrained`` reads the verifier's embedding from `verifier_name_or_path`)."""
    if for_vllm:
        check_vllm(head)
    folder = Path(folder)
    tensors = ascending_state(head)
    identity = not bool(tensors["d2t"].any()) and bool(tensors["t2d"].all())
    if identity:
        del tensors["d2t"], tensors["t2d"]
    if include_embedding:
        tensors["embed_tokens.weight"] = head.embedding.weight.detach().to("cpu", head.fc.weight.dtype).contiguous()
    config = speculators_config(
        head,
        verifier_name_or_path=verifier_name_or_path,
        verifier_architectures=verifier_architectures,
        num_speculative_tokens=num_speculative_tokens,
    )
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_NAME), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def load_speculators(folder: str | os.PathLike, target: Any) -> FeatureHead:
    """The EAGLE-3 head speculators saved in `folder`, for `target`, in eval mode on the target's device and dtype.

    Every check of the module docstring and of `hf_metasd.feature_head.io` runs before a tensor is read;
    ``embed_tokens.weight`` is checked for shape and not read (the head shares the target's embedding)."""
    folder = Path(folder)
    fix = "Restore the file, or re-save the head with `save_speculators`."
    where = repr(str(folder / "config.json"))
    data = read_json(folder / "config.json", fix)
    check_layout(data, where)  # before the weights: EAGLE's original layout may hold none that load
    files = weight_files(folder, WEIGHTS_NAME, fix)
    config = config_from_speculators(data, target, fc_bias="fc.bias" in tensor_names(files, fix), where=where)
    expected = expected_state(config, target, f"the EAGLE-3 head at {str(folder)!r}")
    optional = frozenset({"d2t", "t2d"} if config.draft_vocab_size == config.vocab_size else set())
    skipped = {"embed_tokens.weight": (config.vocab_size, config.hidden_size)}
    tensors = read_tensors(files, expected, optional=optional, skipped=skipped)
    if ("d2t" in tensors) != ("t2d" in tensors):
        raise InvalidPoolError(f"the weights in {str(folder)!r} must hold both `d2t` and `t2d` or neither. {fix}")
    return load_state(new_head(config, target), tensors, f"the EAGLE-3 head at {str(folder)!r}")
