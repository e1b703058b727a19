"""Bandit policies that pick the drafter of each round. Pure Python: no torch, no model code.

Importing this package registers every built-in policy (one module each) in `POLICY_REGISTRY`.
"""

from .base import Policy
from .discounted_ucb import DiscountedUCB
from .epsilon_greedy import EpsilonGreedy
from .exp3 import EXP3
from .fixed import FixedPolicy
from .hedge import Hedge
from .random_policy import RandomPolicy
from .registry import POLICY_REGISTRY, get_policy, register_policy
from .round_robin import RoundRobin
from .sliding_window_ucb import SlidingWindowUCB
from .successive_halving import SuccessiveHalving
from .thompson import ThompsonSampling
from .ucb import UCB

__all__ = [
    "EXP3",
    "POLICY_REGISTRY",
    "UCB",
    "DiscountedUCB",
    "EpsilonGreedy",
    "FixedPolicy",
    "Hedge",
    "Policy",
    "RandomPolicy",
    "RoundRobin",
    "SlidingWindowUCB",
    "SuccessiveHalving",
    "ThompsonSampling",
    "get_policy",
    "register_policy",
]
