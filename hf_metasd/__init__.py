"""hf_metasd: multi-drafter speculative decoding (MetaSD) for Hugging Face transformers.

Importing the package changes nothing in transformers; call `hf_metasd.enable()` to let `generate` take
`assistant_models=[...]`, or pass `custom_generate=hf_metasd.generate`.
"""

from ._version import __version__
from .batched import MetaSDBatchStats
from .candidate_generator import MetaCandidateGenerator
from .drafters import (
    CorpusDrafter,
    Drafter,
    EarlyExitDrafter,
    FeatureHeadDrafter,
    LoraDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    TokenizerBridgeDrafter,
    TokenRecyclingDrafter,
    as_drafters,
)
from .errors import (
    DrafterCompatibilityError,
    InvalidPoolError,
    MetaSDConfigError,
    MetaSDDrafterError,
    MetaSDTypeError,
    PolicyArmError,
    UnknownPolicyError,
    UnknownRewardError,
)
from .generation import MetaSDGenerateOutput, disable, enable, generate, is_enabled
from .policies import (
    EXP3,
    POLICY_REGISTRY,
    UCB,
    DiscountedUCB,
    EpsilonGreedy,
    FixedPolicy,
    Hedge,
    Policy,
    RandomPolicy,
    RoundRobin,
    SlidingWindowUCB,
    SuccessiveHalving,
    ThompsonSampling,
    get_policy,
    register_policy,
)
from .pool import DrafterPool, DrafterPoolConfig, DrafterSpec
from .reward_memory import clear_reward_memory, reward_memory_scope
from .rewards import REWARDS, RoundFeedback, block_divergence, block_efficiency
from .settings import MetaSDSettings
from .stats import MetaSDStats

__all__ = [
    "CorpusDrafter",
    "DiscountedUCB",
    "Drafter",
    "DrafterCompatibilityError",
    "DrafterPool",
    "DrafterPoolConfig",
    "DrafterSpec",
    "EXP3",
    "EarlyExitDrafter",
    "EpsilonGreedy",
    "FeatureHeadDrafter",
    "FixedPolicy",
    "Hedge",
    "InvalidPoolError",
    "LoraDrafter",
    "MetaCandidateGenerator",
    "MetaSDBatchStats",
    "MetaSDConfigError",
    "MetaSDDrafterError",
    "MetaSDGenerateOutput",
    "MetaSDSettings",
    "MetaSDStats",
    "MetaSDTypeError",
    "ModelDrafter",
    "POLICY_REGISTRY",
    "Policy",
    "PolicyArmError",
    "PromptLookupDrafter",
    "REWARDS",
    "RandomPolicy",
    "RoundFeedback",
    "RoundRobin",
    "SlidingWindowUCB",
    "SuccessiveHalving",
    "ThompsonSampling",
    "TokenRecyclingDrafter",
    "TokenizerBridgeDrafter",
    "UCB",
    "UnknownPolicyError",
    "UnknownRewardError",
    "__version__",
    "as_drafters",
    "block_divergence",
    "block_efficiency",
    "clear_reward_memory",
    "disable",
    "enable",
    "generate",
    "get_policy",
    "is_enabled",
    "register_policy",
    "reward_memory_scope",
]
