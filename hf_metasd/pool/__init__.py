"""Drafter pools as Hub artefacts: `DrafterPoolConfig` (the versioned `config.json`) and `DrafterPool`.

A pool is the ordered drafters plus the defaults of a MetaSD call (policy, reward, draft length, optional priors).
It is saved, loaded and pushed the way huggingface_hub's `ModelHubMixin` integrations are (a push is one commit
holding `config.json`, the `README.md` model card and any weights the pool stores itself), and it can be passed
straight to generation::

    pool = DrafterPool.from_pretrained("me/smollm2-drafters", target=target)
    target.generate(**inputs, custom_generate=hf_metasd.generate, assistant_models=pool)

A `DrafterPool` given as ``assistant_models=`` brings its policy, reward and `num_assistant_tokens` as defaults;
explicit ``meta_policy=`` / ``meta_reward=`` / ``num_assistant_tokens=`` arguments still win. We pass the pool object
itself (rather than unpacking it) so that one object carries everything a pool's author tuned.

The package, one concept per module (it builds on `hf_metasd.drafters`, which owns each entry's save / load):

* `config` -- `DrafterPoolConfig` (the file): schema, validation, sorted JSON, versions; its entries are
  `hf_metasd.drafters.spec.DrafterSpec`;
* `pool` -- `DrafterPool`: one plan per save or push, Hub I/O; every drafter kind saves and loads itself through the
  `hf_metasd.drafters.save.SaveContext` / `hf_metasd.drafters.load.LoadContext` (`Drafter.to_spec` /
  `Drafter.from_spec`), so that nothing here names a kind;
* `card` -- the model card.

Loading a pool is as safe as loading safetensors (`hf_metasd.untrusted`): no code runs, only the pool's own
files are read (a local folder outside it only when the caller maps it with ``local_paths=``), every number is
bounded, tokenizers are checked, and any failure is an `InvalidPoolError` naming the file.

What is stored where (`config.json`, one entry per drafter, see `DrafterSpec`):

* model-free drafters (``prompt_lookup``) and ``early_exit`` drafters (the target's own layers): their parameters only;
* ``corpus`` drafters: their settings, and the corpus itself, always inside the pool (``corpus/<name>/``);
* ``assistant_model`` and ``lora`` drafters: by default a *reference* (a Hub repo id or local path, plus a revision);
  with ``save_pretrained(..., store_weights=True)`` their weights are written inside the pool folder instead
  (``drafters/<name>/``, ``lora/<name>/base/`` + ``lora/<name>/adapters/<adapter>/``). A drafter whose embedding and LM
  head are the target's (``share_target_embeddings``) is stored without them and re-attached to the target's modules
  on load, so a small trained drafter base with several adapters takes a few MB;
* restricted heads (``head_token_ids``) are always stored in the pool as a JSON list of ids.

Example `config.json` for a folder produced by ``recipes/pools/train_drafters.py`` (``base/``, ``adapters/<task>/``,
``head_token_ids.json``), which `DrafterPool.from_pretrained(folder, target=target)` then loads::

    {"drafters": [{"adapters": ["code", "qa"], "kind": "lora", "name": "smollm2-drafters",
                   "params": {"adapters_dir": "adapters", "base": "base", "head_token_ids": "head_token_ids.json",
                              "share_target_embeddings": true},
                   "path": ".", "revision": null, "stored": true},
                  {"adapters": null, "kind": "prompt_lookup", "name": "prompt_lookup",
                   "params": {"max_matching_ngram_size": 2, "num_output_tokens": null},
                   "path": null, "revision": null, "stored": false}],
     "format_version": 1, "hf_metasd_version": "0.1.0", "num_assistant_tokens": 4, "policy": "ucb",
     "policy_kwargs": {}, "reward": "speed", "target": "HuggingFaceTB/SmolLM2-135M-Instruct"}
"""

from .config import CONFIG_NAME, FORMAT_VERSION, DrafterPoolConfig, DrafterSpec
from .pool import MODEL_CARD_NAME, DrafterPool

__all__ = ["CONFIG_NAME", "FORMAT_VERSION", "MODEL_CARD_NAME", "DrafterPool", "DrafterPoolConfig", "DrafterSpec"]
