"""Property test: random generation settings x every policy x every drafter kind x three rewards, against plain generate.

**Greedy** (`test_greedy_output_is_plain_generates`): one combination per (policy, pool, reward) triple, i.e.
``len(POLICY_REGISTRY)`` policies x (one pool per kind of `DRAFTER_KINDS`, built by ``tests/test_drafters.py::FACTORIES``,
plus a mixed pool of all of them) x 3 rewards (``speed``, ``bd``, ``eal``): at the time of writing 12 x 7 x 3 = **252
combinations** (six kinds with the new ``other_tokenizer``; 216 with the five of the last commit), and a policy or kind
registered later adds its own. Each draws, from a seeded `random.Random`: the
prompt, ``max_new_tokens`` (1-30), ``num_assistant_tokens`` (1-6), ``eos_token_id`` (none, one id, or a list of ids,
taken among the tokens the target emits so that they fire), a custom `StoppingCriteria` (none, stop after k tokens,
stop on an emitted token), logits processors (``repetition_penalty``, ``no_repeat_ngram_size``, ``min_new_tokens``,
``suppress_tokens`` among the emitted tokens), ``return_dict_in_generate``, and the arm of the ``fixed`` policy; one combination in four goes through
`hf_metasd.enable()` instead of ``custom_generate``. The output must be plain `generate`'s with the same arguments (and
fresh, equal stopping criteria), and the custom criterion must be called with the same sequences. (A drafter that
drafts badly, e.g. from a stale cache or without the call's processors, cannot change a greedy output, only its
speed: `tests/test_drafter_caches.py` checks those.)

**Sampling** (`test_sampling_follows_the_targets_distribution`): **4 combinations** on a 6-token vocabulary, each
with a drawn policy (a persistent instance, so that over the samples every drafter of the pool drafts), reward, draft
length, output length, temperature / top-k / top-p and processors; 800 samples each, and a chi-square test of the
first two sampled tokens against plain sampling's exact joint distribution (from plain `generate`'s own processed
scores), p > 1e-4 (a false alarm once in 10,000 runs per combination). A sample on a token of probability 0 fails.
Verifying with the target's unprocessed logits fails 3 of the 4 combinations.

In all 257 tests (252 + 4 + the kind-coverage check): about 65 s on one idle core (``OMP_NUM_THREADS=1``; about 25 s
greedy, 40 s sampling), 100-115 s while another CPU-bound job shares a 2-core machine.
"""

from __future__ import annotations

import random
from itertools import product
from typing import Any

import pytest
import torch
from conftest import StopAfter, StopOnToken, greedy, prompts, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model
from test_drafters import FACTORIES
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_metasd
from hf_metasd.drafters import (
    DRAFTER_KINDS,
    CorpusDrafter,
    EarlyExitDrafter,
    LoraDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    as_drafters,
)
from hf_metasd.policies import POLICY_REGISTRY, get_policy

scipy_stats = pytest.importorskip("scipy.stats")

#: Kinds that cannot be built with the session's tiny models, with the reason. None at the time of writing. A kind
#: in `DRAFTER_KINDS` is drawn exactly when it has a factory in `FACTORIES`; one that has neither a factory nor an
#: entry here fails `test_every_registered_kind_is_drawn` (it is never skipped silently).
SKIPPED_KINDS: dict[str, str] = {}

SEED = 20240613
POLICIES = sorted(POLICY_REGISTRY)
KINDS = sorted(kind for kind in DRAFTER_KINDS if kind in FACTORIES and kind not in SKIPPED_KINDS)
POOLS = [*KINDS, "mixed"]
REWARDS = ["speed", "bd", "eal"]
TRIPLES = list(product(POLICIES, POOLS, REWARDS))
PROMPTS = prompts(8, seed=4321)


def test_every_registered_kind_is_drawn():
    missing = sorted(set(DRAFTER_KINDS) - set(FACTORIES) - set(SKIPPED_KINDS))
    assert not missing, (
        f"drafter kinds {missing} are registered but have no factory in tests/test_drafters.py::FACTORIES: add one "
        "there (or, if the kind cannot be built with tiny models, list it in SKIPPED_KINDS with the reason)"
    )
    assert set(KINDS) == set(DRAFTER_KINDS) - set(SKIPPED_KINDS)
    assert {pool for _, pool, _ in TRIPLES} == {*KINDS, "mixed"} and {p for p, _, _ in TRIPLES} == set(POLICIES)


# ---------------------------------------------------------------------------------------------------------------------
# greedy: output identical to plain generate
# ---------------------------------------------------------------------------------------------------------------------
def _draw_greedy(index: int) -> dict[str, Any]:
    """The random part of greedy combination `index`; token choices are fractions, resolved against the target's
    own output in `_resolve` (they depend on the model)."""
    policy, pool, reward = TRIPLES[index]
    rng = random.Random(SEED * 1_000_003 + index)
    max_new = rng.randint(1, 30)
    combo: dict[str, Any] = {
        "policy": policy,
        "pool": pool,
        "reward": reward,
        "entry": "enable" if index % 4 == 3 else "custom_generate",
        "prompt": rng.randrange(len(PROMPTS)),
        "max_new_tokens": max_new,
        "num_assistant_tokens": rng.randint(1, 6),
        "eos": rng.choice(["none", "one", "list"]),
        "eos_at": [rng.random() for _ in range(rng.randint(2, 3))],
        "stop": rng.choice(["none", "after", "token"]),
        "stop_after": rng.randint(1, 30),
        "stop_at": rng.random(),
        "fixed_arm": rng.random(),
        "processors": {},
        "suppress_at": None,
        "return_dict": rng.random() < 0.3,
    }
    if rng.random() < 0.4:
        combo["processors"]["repetition_penalty"] = round(rng.uniform(1.05, 2.0), 2)
    if rng.random() < 0.35:
        combo["processors"]["no_repeat_ngram_size"] = rng.randint(2, 4)
    if rng.random() < 0.35:
        combo["processors"]["min_new_tokens"] = rng.randint(1, max_new)
    if rng.random() < 0.3:
        combo["suppress_at"] = [rng.random() for _ in range(rng.randint(1, 3))]
    return combo


GREEDY = [_draw_greedy(i) for i in range(len(TRIPLES))]


@pytest.fixture(scope="module")
def pools(target) -> dict[str, list]:
    """One pool per kind (its factory in `FACTORIES`), and a mixed pool of all of them."""
    built = {kind: as_drafters(FACTORIES[kind](target), target) for kind in KINDS}
    built["mixed"] = [drafter for kind in KINDS for drafter in built[kind]]
    return built


def _pick(tokens: list[int], fraction: float) -> int:
    return tokens[min(int(fraction * len(tokens)), len(tokens) - 1)]


def _resolve(combo: dict[str, Any], target, pool: list) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The combination's `generate` kwargs (common to both calls), its MetaSD kwargs and a description of both."""
    prompt = PROMPTS[combo["prompt"]]
    length = prompt.shape[1]
    kwargs: dict[str, Any] = {"max_new_tokens": combo["max_new_tokens"], **combo["processors"]}
    needs_tokens = combo["suppress_at"] is not None or combo["eos"] != "none" or combo["stop"] == "token"
    emitted = greedy(target, prompt, **kwargs)[0, length:].tolist() if needs_tokens else []
    if combo["suppress_at"] is not None:
        kwargs["suppress_tokens"] = sorted({_pick(emitted, f) for f in combo["suppress_at"]})
        emitted = greedy(target, prompt, **kwargs)[0, length:].tolist()
    if combo["eos"] != "none":
        eos = [_pick(emitted, f) for f in combo["eos_at"]]
        kwargs["eos_token_id"] = eos[0] if combo["eos"] == "one" else sorted(set(eos))
    stop: tuple[str, int] | None = None
    if combo["stop"] == "after":
        stop = ("after", combo["stop_after"])
    elif combo["stop"] == "token":
        stop = ("token", _pick(emitted, combo["stop_at"]))
    if combo["return_dict"]:
        kwargs["return_dict_in_generate"] = True
    num_arms = len(pool) + (1 if combo["reward"] == "speed" else 0)  # a cost-aware reward adds the no-draft arm
    meta: dict[str, Any] = {
        "meta_policy": combo["policy"],
        "meta_reward": combo["reward"],
        "num_assistant_tokens": combo["num_assistant_tokens"],
    }
    if combo["policy"] == "fixed":
        meta["meta_policy_kwargs"] = {"arm": min(int(combo["fixed_arm"] * num_arms), num_arms - 1)}
    elif combo["policy"] == "precedence":  # the first arm as the copier, the last as the model drafter
        meta["meta_policy_kwargs"] = {"copier": 0, "model": num_arms - 1}
    described = {"pool": combo["pool"], "entry": combo["entry"], "prompt": prompt.tolist(), **kwargs, **meta}
    if stop is not None:
        described["stopping_criteria"] = f"{stop[0]} {stop[1]}"
    return kwargs, meta, {"stop": stop, "described": described}


def _criterion(stop: tuple[str, int] | None, prompt_length: int) -> StoppingCriteria | None:
    if stop is None:
        return None
    kind, value = stop
    return StopAfter(prompt_length, value) if kind == "after" else StopOnToken(value)


@pytest.mark.parametrize(
    "index", range(len(GREEDY)), ids=[f"{i}-{c['policy']}-{c['pool']}-{c['reward']}" for i, c in enumerate(GREEDY)]
)
def test_greedy_output_is_plain_generates(target, pools, index):
    combo = GREEDY[index]
    pool = pools[combo["pool"]]
    prompt = PROMPTS[combo["prompt"]]
    kwargs, meta, extra = _resolve(combo, target, pool)
    plain_stop, meta_stop = (_criterion(extra["stop"], prompt.shape[1]) for _ in range(2))
    plain_kwargs, meta_kwargs = dict(kwargs), dict(kwargs)
    if plain_stop is not None:
        plain_kwargs["stopping_criteria"] = StoppingCriteriaList([plain_stop])
        meta_kwargs["stopping_criteria"] = StoppingCriteriaList([meta_stop])

    reference = target.generate(prompt, do_sample=False, **plain_kwargs)
    if combo["entry"] == "enable":
        hf_metasd.enable()
        out = target.generate(prompt, do_sample=False, assistant_models=pool, **meta, **meta_kwargs)
    else:
        out = target.generate(
            prompt, do_sample=False, custom_generate=hf_metasd.generate, assistant_models=pool, **meta, **meta_kwargs
        )

    what = f"combination {index}: {extra['described']}"
    if combo["return_dict"]:
        reference, stats, out = reference.sequences, out.metasd, out.sequences
        assert stats.tokens == out.shape[1] - prompt.shape[1], f"{what}: telemetry counts {stats.tokens} tokens"
    assert torch.equal(out, reference), f"{what}:\n  MetaSD {out[0].tolist()}\n  plain  {reference[0].tolist()}"
    if plain_stop is not None:
        assert meta_stop.calls == plain_stop.calls, f"{what}: the stopping criterion saw other sequences"


# ---------------------------------------------------------------------------------------------------------------------
# sampling: the first two tokens follow the target's distribution
# ---------------------------------------------------------------------------------------------------------------------
SMALL_VOCAB = 6
SAMPLES = 800
SMALL_PROMPT = torch.tensor([[1, 4, 2, 1]])
NUM_SAMPLING = 4
#: warpers and processors, one set per sampling combination (each combination draws the rest)
SAMPLING_SETTINGS = [
    {"top_k": 0, "temperature": 0.5},
    {"top_k": 0, "temperature": 1.8, "repetition_penalty": 1.5},
    {"top_k": 2, "no_repeat_ngram_size": 2},
    {"top_k": 0, "top_p": 0.7, "temperature": 1.3, "suppress_tokens": [5]},
]


def _draw_sampling(index: int) -> dict[str, Any]:
    rng = random.Random(SEED * 7_919 + index)
    return {
        "policy": rng.choice(POLICIES),
        "reward": rng.choice(REWARDS),
        "num_assistant_tokens": rng.randint(2, 6),
        "max_new_tokens": rng.randint(2, 4),  # the first round drafts up to max_new_tokens - 1 of the two tested
        "stop_after": rng.choice([None, 2, 3]),
        "fixed_arm": rng.random(),
        **SAMPLING_SETTINGS[index],
    }


SAMPLING = [_draw_sampling(i) for i in range(NUM_SAMPLING)]


@pytest.fixture(scope="module")
def small():
    """A 6-token target and a pool of every kind built for it (the factories in `FACTORIES` build 96-token models)."""
    target = sharpen(tiny_llama(10, vocab=SMALL_VOCAB), 6.0)  # peaked enough that a wrong warper shows
    torch.manual_seed(13)
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    peft_model = get_peft_model(sharpen(tiny_llama(12, layers=1, vocab=SMALL_VOCAB), 3.0), lora, adapter_name="qa")
    peft_model.add_adapter("rag", lora)
    g = torch.Generator().manual_seed(3)
    answers = [
        target.generate(torch.randint(0, SMALL_VOCAB, (1, 4), generator=g), do_sample=False, max_new_tokens=12)
        for _ in range(4)
    ]
    pool = [
        ModelDrafter(sharpen(tiny_llama(11, layers=1, vocab=SMALL_VOCAB), 3.0), name="small"),
        *LoraDrafter.from_peft_model(peft_model.eval()),
        EarlyExitDrafter(target, num_layers=1),
        PromptLookupDrafter(max_matching_ngram_size=1),
        CorpusDrafter.from_sequences([a[0].tolist() for a in answers]),
    ]
    return target, pool


def _plain_scores(target, ids: torch.Tensor, settings: dict[str, Any]) -> torch.Tensor:
    """Plain sampling's next-token distribution after `ids`: the softmax of `generate`'s own processed scores."""
    out = target.generate(
        ids, do_sample=True, max_new_tokens=1, output_scores=True, return_dict_in_generate=True, **settings
    )
    return out.scores[0][0].double().softmax(-1)


def _exact_joint(target, settings: dict[str, Any]) -> torch.Tensor:
    """p(x1, x2 | prompt) of plain sampling with `settings`, shape (V, V)."""
    first = _plain_scores(target, SMALL_PROMPT, settings)
    seconds = torch.stack(
        [
            _plain_scores(target, torch.cat([SMALL_PROMPT, torch.tensor([[x]])], -1), settings)
            for x in range(SMALL_VOCAB)
        ]
    )
    return first[:, None] * seconds


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of `counts` against `probs` (float64; cells with < 5 expected pooled into one)."""
    observed, probs = counts.flatten().double(), probs.flatten().double()
    expected = probs / probs.sum() * observed.sum()
    keep = expected >= 5
    obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
    exp = torch.cat([expected[keep], expected[~keep].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    exp = exp * (obs.sum() / exp.sum())
    return float(scipy_stats.chisquare(obs.numpy(), exp.numpy()).pvalue)


@pytest.mark.parametrize("index", range(NUM_SAMPLING), ids=[f"{i}-{c['policy']}" for i, c in enumerate(SAMPLING)])
def test_sampling_follows_the_targets_distribution(small, index):
    target, pool = small
    combo = SAMPLING[index]
    settings = {k: combo[k] for k in SAMPLING_SETTINGS[index]}
    num_arms = len(pool) + (1 if combo["reward"] == "speed" else 0)
    policy_kwargs = (
        {"arm": min(int(combo["fixed_arm"] * num_arms), num_arms - 1)} if combo["policy"] == "fixed" else {}
    )
    if combo["policy"] == "precedence":
        policy_kwargs = {"copier": 0, "model": num_arms - 1}
    policy = get_policy(combo["policy"], policy_kwargs)  # one instance for every sample: it keeps learning
    kwargs = {
        "max_new_tokens": combo["max_new_tokens"],
        "num_assistant_tokens": combo["num_assistant_tokens"],
        "meta_reward": combo["reward"],
        **settings,
    }
    what = f"sampling combination {index}: policy {combo['policy']} {policy_kwargs}, {kwargs}"
    if combo["stop_after"] is not None:
        what += f", stop after {combo['stop_after']}"
    length = SMALL_PROMPT.shape[1]
    joint = _exact_joint(target, settings)
    counts = torch.zeros(SMALL_VOCAB, SMALL_VOCAB)
    drafted_by: set[int] = set()
    torch.manual_seed(index)
    for _ in range(SAMPLES):
        criteria = StoppingCriteriaList(
            [] if combo["stop_after"] is None else [StopAfter(length, combo["stop_after"])]
        )
        out = target.generate(
            SMALL_PROMPT,
            do_sample=True,
            custom_generate=hf_metasd.generate,
            assistant_models=pool,
            meta_policy=policy,
            stopping_criteria=criteria,
            return_dict_in_generate=True,
            **kwargs,
        )
        counts[out.sequences[0, length], out.sequences[0, length + 1]] += 1
        drafted_by |= {arm for arm, n in zip(out.metasd.arms, out.metasd.drafted) if n > 0}
    impossible = counts[joint == 0].sum()
    assert impossible == 0, f"{what}: {int(impossible)} samples of probability 0"
    p_value = _chi_square_p(counts, joint)
    assert p_value > 1e-4, f"{what}: chi-square p = {p_value:.2e}, drafted by arms {sorted(drafted_by)}"
    assert drafted_by, f"{what}: no round drafted"
