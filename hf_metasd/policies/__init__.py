"""Bandit policies that pick the drafter of each round. Pure Python: no torch, no model code.

Importing this package registers every built-in policy (one module each, with its settings dataclass) in
`POLICY_REGISTRY`.
"""

from .base import Policy, PolicySettings
from .context import RoundContext
from .discounted_ucb import DiscountedUCB, DiscountedUCBSettings
from .epsilon_greedy import EpsilonGreedy, EpsilonGreedySettings
from .exp3 import EXP3, EXP3Settings
from .fixed import FixedPolicy, FixedPolicySettings
from .hedge import Hedge, HedgeSettings
from .precedence import Precedence, PrecedenceSettings
from .random_policy import RandomPolicy
from .registry import POLICY_REGISTRY, get_policy, register_policy
from .round_robin import RoundRobin
from .sliding_window_ucb import SlidingWindowUCB, SlidingWindowUCBSettings
from .successive_halving import SuccessiveHalving, SuccessiveHalvingSettings
from .thompson import ThompsonSampling, ThompsonSamplingSettings
from .throughput import Throughput
from .ucb import UCB, UCBSettings
from .ucb_scaled import ScaledUCB, ScaledUCBSettings
from .ucb_v import UCBV, UCBVSettings

__all__ = [
    "EXP3",
    "POLICY_REGISTRY",
    "UCB",
    "UCBV",
    "DiscountedUCB",
    "DiscountedUCBSettings",
    "EXP3Settings",
    "EpsilonGreedy",
    "EpsilonGreedySettings",
    "FixedPolicy",
    "FixedPolicySettings",
    "Hedge",
    "HedgeSettings",
    "Policy",
    "PolicySettings",
    "Precedence",
    "PrecedenceSettings",
    "RandomPolicy",
    "RoundContext",
    "RoundRobin",
    "ScaledUCB",
    "ScaledUCBSettings",
    "SlidingWindowUCB",
    "SlidingWindowUCBSettings",
    "SuccessiveHalving",
    "SuccessiveHalvingSettings",
    "ThompsonSampling",
    "ThompsonSamplingSettings",
    "Throughput",
    "UCBSettings",
    "UCBVSettings",
    "get_policy",
    "register_policy",
]
