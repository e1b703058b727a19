"""Write a policy, register it, test it by hand, simulate it and use it in `generate`.

Run it from the repository root: ``python docs/tutorials/custom_policy.py`` (a few seconds, no download).
"""

import doctest
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd
from hf_metasd.benchmark.simulate import Scenario, simulate, stopping_time_regret
from hf_metasd.policies import POLICY_REGISTRY, Policy, get_policy, register_policy

torch.set_num_threads(1)


# --8<-- [start:policy]
@register_policy
class ExploreThenCommit(Policy):
    r"""Explore-then-commit.

    Each drafter drafts `warmup` rounds, in pool order; from then on every round picks

    .. math:: i_t = \arg\max_i \; S_i / n_i

    where :math:`S_i` is drafter *i*'s summed reward and :math:`n_i` its number of rounds. Ties go to the lowest index.

    Args:
        warmup: rounds per drafter before committing, :math:`m \ge 1`. Larger explores longer (a more reliable
            choice, more rounds spent on bad drafters); smaller commits sooner.
        seed: unused (deterministic); accepted for a uniform interface.

    Example:
        >>> policy = ExploreThenCommit(warmup=2)
        >>> policy.reset(num_arms=2)
        >>> for arm, r in [(0, 0.25), (0, 0.5), (1, 1.0), (1, 0.5)]:
        ...     policy.update(arm, r)
        >>> policy.means(), policy.select()      # (0.25 + 0.5) / 2 and (1.0 + 0.5) / 2
        ([0.375, 0.75], 1)
    """

    name = "explore_then_commit"  # the registry key: meta_policy="explore_then_commit"

    def __init__(self, warmup: int = 3, *, seed: int | None = None) -> None:
        super().__init__(seed=seed)
        if not isinstance(warmup, int) or isinstance(warmup, bool) or warmup < 1:
            raise ValueError(f"`warmup` must be an int >= 1, but is {warmup!r}. Use e.g. 3.")
        self.warmup = warmup

    def select(self) -> int:
        self._check_ready()  # a clear error if `reset` was never called
        for arm, n in enumerate(self.counts):  # `counts` and `sums` are kept by `Policy.update`
            if n < self.warmup:
                return arm
        return self._argmax(self.means())  # ties go to the lowest index

    def config(self) -> dict[str, Any]:
        return {"warmup": self.warmup, "seed": self.seed}  # what a pool saves to rebuild the policy


# --8<-- [end:policy]

# --8<-- [start:checks]
assert POLICY_REGISTRY["explore_then_commit"] is ExploreThenCommit
failures, _ = doctest.testmod(verbose=False)  # the docstring example is a test too
assert failures == 0

# A hand-computed history, the way tests/test_policies.py tests the built-in policies.
policy = get_policy("explore_then_commit", warmup=1)
policy.reset(num_arms=3)
picks = []
for reward_of_arm in ([0.5, 0.8, 0.1], [0.5, 0.8, 0.1], [0.5, 0.8, 0.1]):
    arm = policy.select()
    picks.append(arm)
    policy.update(arm, reward_of_arm[arm])
assert picks == [0, 1, 2]  # warmup: each drafter once
assert policy.select() == 1  # then the best mean, 0.8
assert get_policy("explore_then_commit", **policy.config()).config() == policy.config()  # config round-trips

try:
    get_policy("explore_then_commit", warmup=0)
except ValueError as err:
    print("bad setting ->", err)
# --8<-- [end:checks]

# --8<-- [start:simulate]
# The simulator measures the cost of exploring: rounds needed for 2000 tokens, minus the best drafter's rounds.
# BD is a smooth reward here; BE (the accepted share of one round) is a noisy one.
scenario = Scenario.stationary([0.8, 0.6, 0.4], draft_length=5, concentration=20)
for reward in ("bd", "be"):
    for name, kwargs in [("explore_then_commit", {"warmup": 3}), ("explore_then_commit", {"warmup": 30}), ("ucb", {})]:
        regret = stopping_time_regret(name, scenario, reward, target_tokens=2000, seeds=range(5), policy_kwargs=kwargs)
        print(f"reward={reward} {name:<20} {str(kwargs):<14} stopping-time regret: {regret:6.1f} rounds")
print("rounds with warmup=3:", simulate("explore_then_commit", scenario, policy_kwargs={"warmup": 3}).rounds)
# --8<-- [end:simulate]


# --8<-- [start:generate]
def tiny_llama(seed: int, layers: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


target = tiny_llama(0, layers=2)
pool = [tiny_llama(seed, layers=1) for seed in (1, 2)]
input_ids = torch.tensor([[5, 17, 42, 8, 23]])
reference = target.generate(input_ids, do_sample=False, max_new_tokens=24)
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=24,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    meta_policy="explore_then_commit",  # by name, like any built-in policy
    meta_policy_kwargs={"warmup": 2},
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)  # every policy is lossless: the target verifies every token
print("drafter of each round:", out.metasd.arms)
# --8<-- [end:generate]
