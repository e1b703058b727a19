"""Settings objects (one frozen dataclass per policy), `get_policy`'s errors for bad settings, and reward-range checks."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from hf_metasd._validation import check_bool, check_choice, check_real, check_unit_reward
from hf_metasd.errors import MetaSDConfigError, UnknownPolicySettingError
from hf_metasd.policies import (
    POLICY_REGISTRY,
    UCB,
    DiscountedUCB,
    DiscountedUCBSettings,
    Hedge,
    Policy,
    PolicySettings,
    UCBSettings,
    get_policy,
    register_policy,
)
from hf_metasd.policies.base import setting

BUILTINS = sorted(
    n for n, cls in POLICY_REGISTRY.items() if cls.__module__.startswith("hf_metasd.policies.")
)  # collected before any test registers its own
UNIT_REWARD = {"discounted_ucb", "exp3", "hedge", "sliding_window_ucb", "thompson", "ucb", "ucb_v"}
ANY_REWARD = {
    "epsilon_greedy",
    "fixed",
    "precedence",
    "random",
    "round_robin",
    "successive_halving",
    "throughput",
    "ucb_scaled",
}


# ---------------------------------------------------------------------------------------------------- settings objects
@pytest.mark.parametrize("name", BUILTINS)
def test_settings_are_one_frozen_dataclass_behind_the_constructor_and_config(name):
    cls = POLICY_REGISTRY[name]
    settings_cls = cls.settings_class
    assert issubclass(settings_cls, PolicySettings) and dataclasses.is_dataclass(settings_cls)
    fields = [f.name for f in dataclasses.fields(settings_cls)]
    params = [p for p in inspect.signature(cls).parameters if p != "seed"]
    assert params == fields  # the constructor takes exactly the settings, in order, plus `seed`
    assert all(f.metadata.get("help") for f in dataclasses.fields(settings_cls))
    policy = cls(seed=4)
    assert isinstance(policy.settings, settings_cls)
    assert policy.config() == {**dataclasses.asdict(policy.settings), "seed": 4}
    assert list(policy.config()) == [*fields, "seed"]
    for field in fields:  # read-only attributes that read the settings
        assert getattr(policy, field) == getattr(policy.settings, field)
    if fields:
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(policy.settings, fields[0], 0)
        with pytest.raises(AttributeError):
            setattr(policy, fields[0], 0)
    rebuilt = cls.from_settings(policy.settings, seed=4)
    assert type(rebuilt) is cls and rebuilt.config() == policy.config()


def test_settings_convert_and_validate_like_the_constructor():
    assert UCB(beta=1).settings == UCBSettings(beta=1.0) and isinstance(UCB(beta=1).beta, float)
    assert UCBSettings().to_dict() == {"beta": 1.0}
    assert "exploration weight" in UCBSettings.describe()["beta"]
    with pytest.raises(ValueError, match=r"`beta` must be a float in \[0, inf\), but is -1\. Use 1\.0 \(the paper's"):
        UCBSettings(beta=-1)
    with pytest.raises(ValueError, match=r"`beta` must be a float in \[0, inf\), but is -1\. Use 0\.25\."):
        DiscountedUCBSettings(beta=-1)  # each policy keeps its own hint
    assert repr(DiscountedUCB(gamma=0.9)) == "DiscountedUCB(gamma=0.9, beta=0.25, seed=None)"


def test_from_settings_refuses_another_policys_settings():
    with pytest.raises(TypeError, match=r"`settings` must be a UCBSettings, but is DiscountedUCBSettings\. Build it"):
        UCB.from_settings(DiscountedUCBSettings())
    assert UCB.from_settings(UCBSettings(beta=0.5)).beta == 0.5


def test_a_custom_policy_without_settings_still_works():
    class Plain(Policy):
        def select(self):
            return 0

    assert Plain(seed=2).config() == {"seed": 2} and Plain().settings == PolicySettings()


def test_a_custom_policy_declares_settings_and_per_drafter_state_once():
    @dataclasses.dataclass(frozen=True)
    class TiltSettings(PolicySettings):
        tilt: float = setting(
            0.5, "how far the weights lean, in [0, 1]", check_real, low=0.0, high=1.0, hint="Use 0.5."
        )

    class Tilted(Policy):
        name = "tilted_test"
        settings_class = TiltSettings
        arm_state = {"weights": float}

        def __init__(self, tilt: float = 0.5, *, seed: int | None = None) -> None:
            self._configure(seed, tilt=tilt)

        def select(self) -> int:
            return self._argmax(self.weights)

        def _observe(self, arm, reward):
            super()._observe(arm, reward)
            self.weights[arm] += self.tilt * reward

    with pytest.raises(ValueError, match=r"`tilt` must be a float in \[0, 1\], but is 2\. Use 0\.5\."):
        Tilted(tilt=2)
    policy = Tilted(tilt=1)
    assert policy.tilt == 1.0 and policy.weights == [] and policy.config() == {"tilt": 1.0, "seed": None}
    policy.reset(num_arms=2)
    policy.update(1, 0.5)
    assert policy.weights == [0.0, 0.5] and policy.select() == 1
    restored = Tilted(tilt=1)
    restored.load_state_dict(policy.state_dict())
    assert restored.weights == [0.0, 0.5] and policy.state_dict()["weights"] == [0.0, 0.5]


def test_a_setting_may_not_shadow_a_policy_attribute():
    @dataclasses.dataclass(frozen=True)
    class Clashing(PolicySettings):
        name: float = setting(1.0, "shadows `Policy.name`", check_real, hint="Use 1.0.")

    with pytest.raises(
        TypeError, match=r"`Clashing\.name` must not reuse a name of `Bad`, but `Bad\.name` is ''\. Rename"
    ):

        class Bad(Policy):
            settings_class = Clashing

            def select(self):
                return 0


# ---------------------------------------------------------------------------------------------------- get_policy errors
def test_unknown_setting_names_the_policy_the_key_and_the_valid_settings():
    with pytest.raises(
        UnknownPolicySettingError,
        match=r"`meta_policy_kwargs` for 'ucb' must use the settings \['beta', 'seed'\], but has unknown 'betta'\. "
        r"Did you mean 'beta'\? See `help\(UCB\)` for what each setting does\.",
    ):
        get_policy("ucb", betta=1)
    err = pytest.raises(MetaSDConfigError, get_policy, "ucb_v", {"zeta": 1.0, "gama": 1, "xyz": 2}).value
    assert isinstance(err, ValueError) and isinstance(err, TypeError)  # TypeError: what the constructor raised
    assert "but has unknown 'gama', 'xyz'" in str(err) and "['b', 'c', 'seed', 'zeta']" in str(err)
    assert get_policy("ucb", beta=1).beta == 1.0  # the fix


def test_settings_that_are_not_a_mapping_are_a_type_error():
    with pytest.raises(
        TypeError,
        match=r"`meta_policy_kwargs` must be a dict of settings, but is str 'beta=1'\. Pass a dict, e\.g\. "
        r"`meta_policy_kwargs=\{'beta': 1\.0\}`\.",
    ):
        get_policy("ucb", "beta=1")
    with pytest.raises(TypeError, match=r"must be a dict of settings, but is list \[\('beta', 1\)\]"):
        get_policy("ucb", [("beta", 1)])
    with pytest.raises(TypeError, match=r"`meta_policy_kwargs` must have setting names \(str\) as keys, but has 0\."):
        get_policy("ucb", {0: 1.0})
    assert get_policy("ucb", {"beta": 1}).beta == 1.0  # the fix
    assert get_policy("ucb", None).config() == UCB().config()


def test_settings_as_a_mapping_and_as_keywords():
    policy = get_policy("discounted_ucb", {"gamma": 0.9}, beta=0.5)
    assert policy.config() == {"gamma": 0.9, "beta": 0.5, "seed": None}
    with pytest.raises(
        TypeError, match=r"settings must be given once, but 'beta' is both in the mapping and a keyword"
    ):
        get_policy("ucb", {"beta": 1.0}, beta=0.5)
    instance = UCB()
    with pytest.raises(ValueError, match=r"`meta_policy_kwargs` must be empty when `meta_policy` is an instance"):
        get_policy(instance, {"beta": 1.0})
    assert get_policy(instance, {}) is instance


def test_custom_policies_are_checked_by_their_signature():
    @register_policy(name="kw_test_policy")
    class Loose(Policy):
        def __init__(self, *, seed=None, **extra):
            super().__init__(seed=seed)
            self.extra = extra

        def select(self):
            return 0

    @register_policy(name="strict_test_policy")
    class Strict(Policy):
        def select(self):
            return 0

    try:
        assert get_policy("kw_test_policy", anything=1).extra == {"anything": 1}  # takes **kwargs: not checked
        with pytest.raises(
            UnknownPolicySettingError, match=r"for 'strict_test_policy' must use the settings \['seed'\]"
        ):
            get_policy("strict_test_policy", warmup=3)
    finally:
        del POLICY_REGISTRY["kw_test_policy"], POLICY_REGISTRY["strict_test_policy"]


# ---------------------------------------------------------------------------------------------------- reward range
def test_the_reward_range_rule_covers_every_builtin():
    assert set(BUILTINS) == UNIT_REWARD | ANY_REWARD
    for name in BUILTINS:
        assert (get_policy(name).reward_bound() == 1.0) == (name in UNIT_REWARD)


@pytest.mark.parametrize("name", sorted(UNIT_REWARD))
def test_unit_reward_policies_refuse_a_reward_outside_zero_one(name):
    policy = get_policy(name, seed=0)
    policy.reset(2)
    before = policy.state_dict()
    for bad in (2.0, -0.5, float("inf")):
        with pytest.raises(ValueError, match=rf"`reward` must be in \[0, 1\] for the '{name}' policy, but is "):
            policy.update(0, bad)
    assert policy.state_dict() == before  # nothing recorded
    with pytest.raises(ValueError, match=r"`reward` must be a number, but is nan\. Check the reward function\."):
        policy.update(0, float("nan"))
    policy.update(0, 1.0 + 1e-9)  # round-off is clipped, not refused
    assert policy.sums == [1.0, 0.0]


@pytest.mark.parametrize("name", sorted(ANY_REWARD))
def test_scale_free_policies_take_any_reward(name):
    policy = get_policy(name, seed=0)
    policy.reset(2)
    policy.update(0, 2.0)
    policy.update(1, -3.0)
    assert policy.sums == [2.0, -3.0]


def test_hedge_checks_counterfactual_rewards_too():
    policy = Hedge()
    policy.reset(2)
    with pytest.raises(ValueError, match=r"`rewards\[1\]` must be in \[0, 1\] for the 'hedge' policy, but is 1\.5\."):
        policy.update_all({0: 0.5, 1: 1.5})
    assert policy.observed_counts == [0, 0]


def test_full_information_is_documented_and_only_hedge_sets_it():
    assert "full_information" in Policy.__doc__ and "update_all" in Policy.__doc__
    assert {name for name in BUILTINS if POLICY_REGISTRY[name].full_information} == {"hedge"}


# ---------------------------------------------------------------------------------------------------- validators
def test_shared_validators():
    assert check_bool("flag", True, hint="Pass True or False.") is True
    with pytest.raises(TypeError, match=r"`flag` must be a bool, but is 1\. Pass True or False\."):
        check_bool("flag", 1, hint="Pass True or False.")
    assert check_choice("reward", "bd", ["bd", "be"]) == "bd"
    with pytest.raises(ValueError, match=r"`reward` must be one of \['bd', 'be'\], but is 'tv'\. Use BD\."):
        check_choice("reward", "tv", ["bd", "be"], hint="Use BD.")
    assert check_unit_reward("ucb_v", 2.0 + 1e-9, high=2.0) == 2.0
    with pytest.raises(ValueError, match=r"`rewards\[3\]` must be in \[0, 2\] for the 'ucb_v' policy, but is 2\.5\."):
        check_unit_reward("ucb_v", 2.5, name="rewards[3]", high=2.0)
