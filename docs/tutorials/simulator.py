"""The policy simulator: compare policies and rewards on simulated drafters, in seconds, without a model.

Run it from the repository root: ``python docs/tutorials/simulator.py``.
"""

from hf_metasd.benchmark.simulate import (
    Scenario,
    replay,
    simulate,
    simulate_oracle,
    simulate_trace,
    stopping_time_regret,
)

# --8<-- [start:scenario]
# Three drafters whose drafted tokens the target accepts with probability 0.8, 0.6 and 0.4; 5 tokens drafted per
# round; per-position acceptance probabilities vary around those rates (Beta noise, concentration 20).
scenario = Scenario.stationary([0.8, 0.6, 0.4], draft_length=5, concentration=20)
print("expected tokens per round:", [round(scenario.expected_tokens(i), 2) for i in range(scenario.num_arms)])

run = simulate("ucb", scenario, reward="bd", target_tokens=2000, seed=0)
oracle = simulate_oracle(scenario, target_tokens=2000, seed=0)
print(f"UCB: {run.rounds} rounds, oracle (always drafter 0): {oracle.rounds} rounds")
print(
    f"UCB used the best drafter in {run.best_arm_ratio():.0%} of its rounds, {run.best_arm_ratio(0.5, 1.0):.0%} "
    "of its second half, and switched drafter",
    run.switches,
    "times",
)
# --8<-- [end:scenario]

# --8<-- [start:regret]
# Stopping-time regret: E[rounds of the policy] - E[rounds of the oracle] to produce B tokens, averaged over seeds
# (common random numbers: at a given seed each drafter's k-th round has the same outcome under every policy).
print(f"{'policy':<20}" + "".join(f"B={b:<7}" for b in (500, 2000, 8000)))
for policy, kwargs in [
    ("ucb", {}),
    ("ucb", {"beta": 0.25}),
    ("thompson", {}),
    ("exp3", {"gamma": 0.1}),
    ("round_robin", {}),
]:
    label = policy + ("" if not kwargs else f" {kwargs['beta' if 'beta' in kwargs else 'gamma']}")
    regrets = [
        stopping_time_regret(policy, scenario, target_tokens=b, seeds=range(3), policy_kwargs=kwargs)
        for b in (500, 2000, 8000)
    ]
    print(f"{label:<20}" + "".join(f"{r:<9.1f}" for r in regrets))
# --8<-- [end:regret]

# --8<-- [start:bd_vs_be]
# BD vs BE. BE counts the accepted prefix; BD averages the acceptance probabilities of all drafted positions. Both rank
# the drafters the same way, but BD's per-round variance is far smaller. Whether that lowers the regret depends on the
# policy: a greedy policy (epsilon-greedy) profits from less noisy means; UCB's bonus does not look at the variance,
# and here BE's means are further apart (E[accepted] / N = 0.54, 0.28, 0.13 against BD's 0.8, 0.6, 0.4), so UCB does
# better with BE in this scenario. Measure on your own rates before you pick.
for reward in ("be", "bd"):
    variance = simulate("round_robin", scenario, reward=reward, target_tokens=3000).reward_variance()
    ucb = stopping_time_regret("ucb", scenario, reward, target_tokens=3000, seeds=range(3))
    greedy = stopping_time_regret(
        "epsilon_greedy", scenario, reward, target_tokens=3000, seeds=range(3), policy_kwargs={"epsilon": 0.05}
    )
    print(
        f"{reward}: reward variance per drafter {[round(v, 4) for v in variance.values()]}, "
        f"regret: ucb {ucb:.1f}, epsilon_greedy {greedy:.1f}"
    )
# --8<-- [end:bd_vs_be]

# --8<-- [start:switching]
# Non-stationary drafters: drafter 0 degrades and drafter 1 improves after 3000 tokens. Plain UCB trusts its old
# means; the discounted and sliding-window variants forget and follow the change.
switching = Scenario.switching([0.8, 0.6, 0.4], [0.55, 0.75, 0.4], switch_at=3000, draft_length=5, concentration=20)
for policy in ("ucb", "discounted_ucb", "sliding_window_ucb"):
    result = simulate(policy, switching, target_tokens=9000, seed=0)
    print(f"{policy:<20} best-drafter rate in the last third: {result.best_arm_ratio(2 / 3, 1.0):.0%}")
# --8<-- [end:switching]

# --8<-- [start:cost]
# Cost-aware: drafter 0 accepts more but is 15x more expensive per drafted token. Fewer rounds is not less time.
costly = Scenario.stationary([0.85, 0.7], draft_length=5, costs=[0.3, 0.02], concentration=20)
for reward in ("bd", "cost"):
    result = simulate("ucb", costly, reward=reward, target_tokens=4000, seed=0)
    print(f"reward={reward:<5} rounds={result.rounds:<5} simulated time={result.wall_time:7.1f} target forwards")
print("best drafter by rounds:", costly.best_arm(measure="rounds"), "by time:", costly.best_arm(measure="wall_time"))
# --8<-- [end:cost]

# --8<-- [start:replay]
# Replay: a full-information trace (every drafter's reward and accepted count each round) lets you compare policies
# on the same rounds. Record one from real decoding with `out.metasd.to_trace()` after a `generate` call with
# `meta_policy="hedge"` and `return_dict_in_generate=True`, or draw one from a scenario, as here.
trace = simulate_trace(scenario, num_rounds=400, seed=1)
for policy in ("ucb", "hedge"):
    result = replay(policy, trace)
    print(f"replay {policy:<6} tokens={result.total_tokens}  best-drafter rate={result.best_arm_ratio():.0%}")
# --8<-- [end:replay]
