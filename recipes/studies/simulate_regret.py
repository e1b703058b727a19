"""Simulated MetaSD: stopping-time regret of the policies, BD vs BE, non-stationary drafters, cost-aware reward.

No model, no GPU: the drafters are the simulated ones of `hf_metasd.benchmark.simulate` (known acceptance rates, per-position
acceptance probabilities drawn from a Beta with concentration 20). Writes four PNGs and `numbers.json` into --out
and prints the key numbers.

    python recipes/studies/simulate_regret.py --quick          # ~seconds: 5 seeds, B up to 4000
    python recipes/studies/simulate_regret.py                  # 20 seeds, B up to 32000

Figures:
    regret_vs_B.png   stopping-time regret (rounds minus the best drafter's rounds) against B, log x-axis
    bd_vs_be.png      per-drafter reward variance under BD and BE, and UCB's best-drafter rate over rounds
    switching.png     best-drafter rate around a change of drafter quality: UCB vs discounted / sliding-window UCB
    cost_aware.png    rounds and simulated wall time when drafters differ in cost: BD reward vs the cost reward
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from hf_metasd.benchmark.simulate import Scenario, simulate, simulate_oracle

REPO = Path(__file__).resolve().parents[2]

MAIN = Scenario.stationary([0.8, 0.6, 0.4], draft_length=5, concentration=20, name="0.8/0.6/0.4")
# drafter 0 degrades, the close second improves after 4000 tokens
SWITCH = Scenario.switching(
    [0.8, 0.6, 0.4], [0.55, 0.75, 0.4], switch_at=4000, draft_length=5, concentration=20, name="switch@4000"
)
# drafter 0 accepts more but costs 0.3 target forwards per drafted token; drafter 1 costs 0.02
COST = Scenario.stationary([0.85, 0.7], draft_length=5, costs=[0.3, 0.02], concentration=20, name="costly/cheap")

# (label, policy, reward, policy kwargs)
REGRET_POLICIES = [
    ("ucb-bd", "ucb", "bd", {}),
    ("ucb-be", "ucb", "be", {}),
    ("exp3-bd", "exp3", "bd", {}),
    ("successive_halving-bd", "successive_halving", "bd", {}),
    ("thompson-bd", "thompson", "bd", {}),
    ("random", "random", "bd", {}),
    ("hedge-bd (full info)", "hedge", "bd", {}),
]
SWITCH_POLICIES = [
    ("ucb (beta=1)", "ucb", {}),
    ("ucb (beta=0.25)", "ucb", {"beta": 0.25}),
    ("discounted_ucb", "discounted_ucb", {}),
    ("sliding_window_ucb", "sliding_window_ucb", {}),
]


def mean_se(values) -> tuple[float, float]:
    v = np.asarray(values, dtype=float)
    return float(v.mean()), float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else 0.0


def regret_vs_b(budgets, seeds, bar) -> dict:
    out = {label: {} for label, *_ in REGRET_POLICIES}
    for b in budgets:
        oracle = {s: simulate_oracle(MAIN, target_tokens=b, seed=s).rounds for s in seeds}
        for label, name, reward, kwargs in REGRET_POLICIES:
            regrets = [
                simulate(name, MAIN, reward=reward, target_tokens=b, seed=s, policy_kwargs=kwargs).rounds - oracle[s]
                for s in seeds
            ]
            m, se = mean_se(regrets)
            out[label][b] = {"mean": m, "se": se}
            bar.update()
    return out


def bd_vs_be(b, seeds, bar) -> dict:
    variance = {}
    for reward in ("bd", "be"):
        per_arm = [
            simulate("round_robin", MAIN, reward=reward, target_tokens=b, seed=s).reward_variance() for s in seeds
        ]
        variance[reward] = {arm: float(np.mean([v[arm] for v in per_arm])) for arm in range(MAIN.num_arms)}
        bar.update()
    curves, last_half = {}, {}
    for reward in ("bd", "be"):
        runs = [simulate("ucb", MAIN, reward=reward, target_tokens=b, seed=s) for s in seeds]
        n = min(r.rounds for r in runs)
        hits = np.array([[a == best for a, best in zip(r.arms[:n], r.best_arms[:n])] for r in runs], dtype=float)
        curves[reward] = hits.mean(axis=0).tolist()
        last_half[reward] = mean_se([r.best_arm_ratio(start=0.5) for r in runs])
        bar.update()
    return {"variance": variance, "curves": curves, "best_arm_ratio_last_half": last_half}


def switching(b, seeds, bar, bin_tokens=250) -> dict:
    bins = np.arange(0, b + bin_tokens, bin_tokens)
    oracle = {s: simulate_oracle(SWITCH, target_tokens=b, seed=s).rounds for s in seeds}
    out = {}
    for label, name, kwargs in SWITCH_POLICIES:
        runs = [simulate(name, SWITCH, target_tokens=b, seed=s, policy_kwargs=kwargs) for s in seeds]
        per_bin = []
        after = []
        for r in runs:
            produced = np.cumsum([0] + r.tokens[:-1])  # tokens before each round: decides its segment
            hit = np.array([a == best for a, best in zip(r.arms, r.best_arms)], dtype=float)
            idx = np.digitize(produced, bins) - 1
            per_bin.append([hit[idx == k].mean() if np.any(idx == k) else np.nan for k in range(len(bins) - 1)])
            after.append(hit[produced >= SWITCH.switch_at[0]].mean())
        out[label] = {
            "regret_rounds": mean_se([r.rounds - oracle[s] for r, s in zip(runs, seeds)]),
            "best_arm_ratio_after_switch": mean_se(after),
            "curve": np.nanmean(np.array(per_bin), axis=0).tolist(),
        }
        bar.update()
    return {"bins": bins[:-1].tolist(), "bin_tokens": bin_tokens, "policies": out}


def cost_aware(b, seeds, bar) -> dict:
    out = {}
    rows = [("ucb-bd", "ucb", "bd", {}), ("ucb-cost", "ucb", "cost", {}), ("thompson-cost", "thompson", "cost", {})]
    rows += [(f"fixed {arm} (c={COST.costs[arm]})", "fixed", "bd", {"arm": arm}) for arm in range(COST.num_arms)]
    for label, name, reward, kwargs in rows:
        runs = [simulate(name, COST, reward=reward, target_tokens=b, seed=s, policy_kwargs=kwargs) for s in seeds]
        out[label] = {
            "rounds": mean_se([r.rounds for r in runs]),
            "wall_time": mean_se([r.wall_time for r in runs]),
            "cheap_drafter_ratio": mean_se([r.best_arm_ratio(measure="wall_time") for r in runs]),
        }
        bar.update()
    return out


def plot(results: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    # 1. regret vs B
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, per_b in results["regret"].items():
        bs = sorted(per_b, key=int)
        m = np.array([per_b[b]["mean"] for b in bs])
        se = np.array([per_b[b]["se"] for b in bs])
        x = [int(b) for b in bs]
        ax.plot(x, m, marker="o", ms=3, label=label)
        ax.fill_between(x, m - se, m + se, alpha=0.2)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("target tokens B (log)")
    ax.set_ylabel("stopping-time regret (rounds, symlog)")
    ax.set_title(f"Regret vs B: drafters {MAIN.name}, N={MAIN.draft_length}, {results['meta']['seeds']} seeds")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(out / "regret_vs_B.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # 2. BD vs BE
    bdbe = results["bd_vs_be"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    arms = np.arange(MAIN.num_arms)
    for offset, reward in ((-0.2, "bd"), (0.2, "be")):
        ax1.bar(arms + offset, [bdbe["variance"][reward][a] for a in arms], width=0.4, label=reward.upper())
    ax1.set_yscale("log")
    ax1.set_xticks(arms, [f"drafter {a}\nalpha={MAIN.alphas[0][a]}" for a in arms])
    ax1.set_ylabel("reward variance per round (log)")
    ax1.set_title("Reward variance, same drafters (round robin)")
    ax1.legend()
    for reward in ("bd", "be"):
        curve = np.array(bdbe["curves"][reward])
        window = max(1, len(curve) // 40)
        smooth = np.convolve(curve, np.ones(window) / window, mode="valid")
        ax2.plot(np.arange(smooth.size) + window, smooth, label=f"ucb-{reward}")
    ax2.set_xlabel("round")
    ax2.set_ylabel("P(best drafter), moving average")
    ax2.set_ylim(0, 1.02)
    ax2.set_title(f"UCB best-drafter rate, B={results['meta']['bd_be_tokens']}")
    ax2.grid(alpha=0.3)
    ax2.legend()
    paths.append(out / "bd_vs_be.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # 3. switching
    sw = results["switching"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    x = np.array(sw["bins"]) + sw["bin_tokens"] / 2
    for label, data in sw["policies"].items():
        ratio = data["best_arm_ratio_after_switch"][0]
        ax.plot(x, data["curve"], label=f"{label} (after switch: {ratio:.2f})")
    ax.axvline(SWITCH.switch_at[0], color="k", ls="--", lw=1)
    ax.set_xlabel("tokens produced")
    ax.set_ylabel("P(best drafter) per token bin")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"Switching drafters {SWITCH.alphas[0]} -> {SWITCH.alphas[1]} at {SWITCH.switch_at[0]} tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(out / "switching.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    # 4. cost-aware
    cost = results["cost_aware"]
    labels = list(cost)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((ax1, "rounds", "rounds"), (ax2, "wall_time", "simulated wall time (target forwards)")):
        ax.bar(range(len(labels)), [cost[lbl][key][0] for lbl in labels], yerr=[cost[lbl][key][1] for lbl in labels])
        ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(
        f"Cost-aware reward: alphas {COST.alphas[0]}, costs {COST.costs} per drafted token, "
        f"B={results['meta']['cost_tokens']}"
    )
    paths.append(out / "cost_aware.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    return paths


def report(results: dict) -> None:
    print("\n== stopping-time regret (rounds, mean +- s.e. over seeds) ==")
    bs = sorted({int(b) for per_b in results["regret"].values() for b in per_b})
    print(f"{'policy':<24}" + "".join(f"{'B=' + str(b):>15}" for b in bs))
    for label, per_b in results["regret"].items():
        print(f"{label:<24}" + "".join(f"{per_b[b]['mean']:>9.1f} +-{per_b[b]['se']:<4.1f}" for b in bs))
    bdbe = results["bd_vs_be"]
    print("\n== reward variance per drafter (round robin) ==")
    for arm in range(MAIN.num_arms):
        bd, be = bdbe["variance"]["bd"][arm], bdbe["variance"]["be"][arm]
        print(f"drafter {arm} (alpha={MAIN.alphas[0][arm]}): BD {bd:.5f}  BE {be:.5f}  BD/BE {bd / be:.3f}")
    for reward, (m, se) in bdbe["best_arm_ratio_last_half"].items():
        print(f"ucb-{reward} best-drafter ratio over the last half of the rounds: {m:.3f} +- {se:.3f}")
    print(f"\n== switching scenario, B={results['meta']['switch_tokens']} ==")
    for label, data in results["switching"]["policies"].items():
        (rm, rse), (am, ase) = data["regret_rounds"], data["best_arm_ratio_after_switch"]
        print(
            f"{label:<20} regret {rm:7.1f} +- {rse:4.1f} rounds   best-drafter ratio after switch {am:.3f} +- {ase:.3f}"
        )
    print(f"\n== cost-aware, B={results['meta']['cost_tokens']} ==")
    for label, data in results["cost_aware"].items():
        print(
            f"{label:<24} rounds {data['rounds'][0]:8.1f}   wall time {data['wall_time'][0]:8.1f}   "
            f"cheap-drafter ratio {data['cheap_drafter_ratio'][0]:.3f}"
        )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 seeds, B up to 4000 (seconds)")
    parser.add_argument("--seeds", type=int, default=None, help="number of seeds (default 5 quick, 20 full)")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "assets" / "simulator", help="output folder")
    args = parser.parse_args(argv)

    n_seeds = args.seeds or (5 if args.quick else 20)
    if n_seeds < 2:
        parser.error(f"`--seeds` must be >= 2 (standard errors need two), but is {n_seeds}. Use 5 or more.")
    seeds = list(range(n_seeds))
    budgets = [250, 500, 1000, 2000, 4000] if args.quick else [250, 500, 1000, 2000, 4000, 8000, 16000, 32000]
    bd_be_tokens = 2000 if args.quick else 8000
    switch_tokens = 8000 if args.quick else 12000
    cost_tokens = 2000 if args.quick else 8000
    args.out.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    steps = len(budgets) * len(REGRET_POLICIES) + 4 + len(SWITCH_POLICIES) + 5
    with tqdm(total=steps, desc="simulating", file=sys.stderr) as bar:
        results = {
            "meta": {
                "seeds": n_seeds,
                "quick": args.quick,
                "budgets": budgets,
                "bd_be_tokens": bd_be_tokens,
                "switch_tokens": switch_tokens,
                "cost_tokens": cost_tokens,
                "scenarios": {
                    s.name: {
                        "alphas": s.alphas,
                        "switch_at": s.switch_at,
                        "draft_length": s.draft_length,
                        "costs": s.costs,
                        "concentration": s.concentration,
                    }
                    for s in (MAIN, SWITCH, COST)
                },
            },
            "regret": regret_vs_b(budgets, seeds, bar),
            "bd_vs_be": bd_vs_be(bd_be_tokens, seeds, bar),
            "switching": switching(switch_tokens, seeds, bar),
            "cost_aware": cost_aware(cost_tokens, seeds, bar),
        }
    results["meta"]["seconds"] = round(time.perf_counter() - start, 1)
    report(results)
    paths = plot(results, args.out)
    numbers = {k: v for k, v in results.items() if k != "bd_vs_be"}
    numbers["bd_vs_be"] = {k: v for k, v in results["bd_vs_be"].items() if k != "curves"}  # curves only in the PNG
    numbers["switching"] = {
        label: {k: v for k, v in data.items() if k != "curve"}
        for label, data in results["switching"]["policies"].items()
    }
    (args.out / "numbers.json").write_text(json.dumps(numbers, indent=1, sort_keys=True) + "\n")
    print(
        f"\nwrote {', '.join(str(p) for p in [*paths, args.out / 'numbers.json'])} in {results['meta']['seconds']} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
