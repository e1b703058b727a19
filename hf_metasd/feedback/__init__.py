r"""What a round teaches: the round as the reward sees it, the rewards the call's policy learns from it, and the arms
scored on it in hindsight.

Once the target verified a round, `MetaCandidateGenerator.update_candidate_strategy` folds what the round measured
into the call's estimates (`hf_metasd.costs`, `hf_metasd.draft_length`), then learns from it through this package:

* `RoundRewards` (`round_rewards`): the round's feedback (`RoundRewards.feedback`, a
  `hf_metasd.rewards.RoundFeedback`), the pull's reward told to the policy (`learn`: the prefill round's deferred
  until its costs are known, the calibration round, the no-draft arm's reward known without a pull), every reward
  remembered for later calls.
* `counterfactual_feedback` (`counterfactual`): for a full-information policy, every other drafter scored on the
  round's accepted window (`RoundRewards.learn_counterfactual`).
* `Replay` (`replay`): replayed rounds, model-free arms scored in hindsight under greedy decoding
  (`RoundRewards.learn_replayed`).

The reward functions themselves are pure and live in `hf_metasd.rewards`.
"""

from .counterfactual import counterfactual_feedback, is_distribution
from .replay import Replay, ReplayedRound, replay_applies, replayed_accepted, replayed_feedback
from .round_rewards import RoundRewards

__all__ = [
    "Replay",
    "ReplayedRound",
    "RoundRewards",
    "counterfactual_feedback",
    "is_distribution",
    "replay_applies",
    "replayed_accepted",
    "replayed_feedback",
]
