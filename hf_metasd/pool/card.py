"""The model card (`README.md`) of a pool: Hub metadata, the drafter table, the defaults, the priors, a usage snippet."""

from __future__ import annotations

import json

from huggingface_hub import ModelCard, ModelCardData

from ..drafters import DRAFTER_KINDS
from ..policies import get_policy
from .config import DrafterPoolConfig

__all__ = ["LIBRARY_NAME", "REPO_URL", "TAGS", "policy_description", "pool_card"]

LIBRARY_NAME = "hf_metasd"
REPO_URL = "https://github.com/hf-metasd/hf_metasd"
TAGS = ["hf_metasd", "metasd", "speculative-decoding"]


def policy_description(config: DrafterPoolConfig) -> str:
    """The policy with every setting it runs with (defaults included), e.g. ``exp3 (gamma=0.1)``.

    Example:
        >>> policy_description(DrafterPoolConfig(policy="exp3", policy_kwargs={"gamma": 0.2}))
        'exp3 (gamma=0.2)'
        >>> policy_description(DrafterPoolConfig(policy="round_robin"))
        'round_robin (no settings)'
    """
    settings = {**get_policy(config.policy, **config.policy_kwargs).settings.to_dict(), **config.policy_kwargs}
    shown = ", ".join(f"{k}={json.dumps(v)}" for k, v in settings.items())
    return f"{config.policy} ({shown or 'no settings'})"


def pool_card(config: DrafterPoolConfig, *, repo_id: str | None = None) -> ModelCard:
    """The model card of a valid pool config: ``library_name: hf_metasd``, ``base_model:`` the target, the drafter
    table, the defaults (policy with its settings, reward, draft length), the priors, a usage snippet for `repo_id`.

    Example:
        >>> from hf_metasd.pool import DrafterSpec
        >>> config = DrafterPoolConfig([DrafterSpec("prompt_lookup", "pl")], policy="exp3", target="org/model")
        >>> card = str(pool_card(config, repo_id="me/pool"))
        >>> "base_model: org/model" in card, "policy `exp3 (gamma=0.1)`" in card
        (True, True)
    """
    repo_id = repo_id or "path/to/this/pool"
    data = ModelCardData(library_name=LIBRARY_NAME, tags=sorted(TAGS), base_model=config.target or None)
    rows, arm = [], 0
    for spec in config.drafters:
        names = DRAFTER_KINDS[spec.kind].arm_names(spec)
        if spec.stored:
            where = f"stored: `{spec.path}`"
        elif spec.path:
            where = f"`{spec.path}`" + (f" @ `{spec.revision}`" if spec.revision else "")
        else:
            where = "config only"
        details = ", ".join(f"{k}={v}" for k, v in sorted(spec.params.items()) if v not in (None, False))
        for name in names:
            rows.append(f"| {arm} | `{name}` | {spec.kind} | {where} | {details or '-'} |")
            arm += 1
    target = config.target or "<target model id>"
    body = f"""
# MetaSD drafter pool for `{target}`

A pool of {arm} drafters for multi-drafter speculative decoding (MetaSD) with
[hf_metasd]({REPO_URL}): each round, a bandit policy picks the drafter that drafts, and
the target verifies every drafted token, so the output is exactly the target's own.

| arm | drafter | kind | weights | parameters |
|---|---|---|---|---|
{chr(10).join(rows)}

Defaults: policy `{policy_description(config)}`, reward `{config.reward}`, `num_assistant_tokens={config.num_assistant_tokens}` (hf_metasd {config.hf_metasd_version}, pool format {config.format_version}).
{_priors_section(config)}{_tokenizer_line(config)}
## Usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_metasd
from hf_metasd import DrafterPool

target = AutoModelForCausalLM.from_pretrained("{target}")
tokenizer = AutoTokenizer.from_pretrained("{target}")
pool = DrafterPool.from_pretrained("{repo_id}", target=target{", tokenizer=tokenizer" if config.tokenizer_hash else ""})

inputs = tokenizer("Write a haiku about speculative decoding.", return_tensors="pt")
out = target.generate(**inputs, max_new_tokens=128, custom_generate=hf_metasd.generate, assistant_models=pool)
print(tokenizer.decode(out[0], skip_special_tokens=True))
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def _priors_section(config: DrafterPoolConfig) -> str:
    if config.priors is None:
        return ""
    weight = (
        "the policy's default number of" if config.prior_weight is None else f"`prior_weight={config.prior_weight:g}`"
    )
    rows = "\n".join(f"| `{name}` | {value:g} |" for name, value in config.priors.items())
    return (
        f"\nPriors: the policy starts from these mean rewards (under `{config.reward}`), each worth {weight} "
        f"rounds.\n\n| drafter | prior mean reward |\n|---|---|\n{rows}\n"
    )


def _tokenizer_line(config: DrafterPoolConfig) -> str:
    if config.tokenizer_hash is None:
        return ""
    return (
        f"\nTokenizer fingerprint: `{config.tokenizer_hash}` (pass `tokenizer=` to `from_pretrained` to check "
        "yours).\n"
    )
