"""Replay per-round policies over the recordings of `recipes/pools/record_rounds.py`, on this machine's costs.

Greedy decoding makes a round exact to replay: the proposal of the round's arm at position ``t`` of the target's
answer is accepted up to its common prefix with the answer, and the next round starts after that prefix and the
target's own token. Model arms' proposals are read from the recording (truncated to the round's length: greedy
drafts of ``n`` tokens are prefixes of longer ones); model-free arms (corpus drafters, prompt lookup, token recycling)
run here on the recorded tokens, token recycling learning from the recorded top-k of the positions each round's pass
verifies. Time comes from costs measured with nothing else running (`measure_costs`): the target's pass over ``k``
tokens, a model drafter's forward over ``m`` tokens, its prompt prefill.

The replay ranks policies on dev prompts in seconds; every figure the docs quote as a speedup comes from real runs
(`hf-metasd bench`).

    python recipes/pools/replay_rounds.py artifacts/rounds/qwen_dev.pt --costs artifacts/rounds/qwen_costs.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))


# ---------------------------------------------------------------------------------------------------------------------
# costs
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Costs:
    """Seconds on one machine. `verify[k]`: the target's pass over k tokens with a cache (k >= 1);
    `target_prefill`: the target's prompt pass per prompt token; `forward[name][m]`: a model drafter's forward over
    m tokens with a cache (m >= 1; longer ones extrapolated linearly); `drafter_prefill[name]`: its prompt prefill per
    prompt token; `copier`: one model-free proposal; `overhead`: per round (policy, bookkeeping)."""

    verify: dict[int, float]
    target_prefill: float
    forward: dict[str, dict[int, float]]
    drafter_prefill: dict[str, float]
    copier: float = 0.0005
    overhead: float = 0.002

    def v(self, k: int) -> float:
        if k in self.verify:
            return self.verify[k]
        top = max(self.verify)
        slope = (self.verify[top] - self.verify[top - 1]) if top - 1 in self.verify else 0.0
        return self.verify[top] + slope * (k - top)

    def f(self, name: str, m: int) -> float:
        table = self.forward[name]
        if m in table:
            return table[m]
        top = max(table)
        slope = (table[top] - table[top - 1]) if top - 1 in table else 0.0
        return table[top] + slope * (m - top)

    @classmethod
    def load(cls, path: Path) -> Costs:
        raw = json.loads(Path(path).read_text())
        return cls(
            verify={int(k): v for k, v in raw["verify"].items()},
            target_prefill=raw["target_prefill"],
            forward={n: {int(k): v for k, v in t.items()} for n, t in raw["forward"].items()},
            drafter_prefill=raw["drafter_prefill"],
            copier=raw.get("copier", 0.0005),
            overhead=raw.get("overhead", 0.002),
        )


# ---------------------------------------------------------------------------------------------------------------------
# model-free arms
# ---------------------------------------------------------------------------------------------------------------------
class Recycling:
    """Token recycling: per token, the target's top-1 next token the last pass that saw it gave (a chain walk)."""

    def __init__(self, order: int = 1) -> None:
        self.next: dict[tuple[int, ...], int] = {}
        self.order = order

    def learn(self, ids: Sequence[int], top: torch.Tensor, positions: range) -> None:
        """Positions `positions` of `ids` were verified: their top-1 next tokens `top[p, 0]`."""
        for p in positions:
            nxt = int(top[p, 0])
            for o in range(1, self.order + 1):
                if p - o + 1 < 0:
                    break
                self.next[tuple(ids[p - o + 1 : p + 1])] = nxt

    def propose(self, ids: list[int], n: int) -> tuple[list[int], int]:
        out: list[int] = []
        seq = list(ids[-self.order :])
        for _ in range(n):
            token = None
            for o in range(min(self.order, len(seq)), 0, -1):
                token = self.next.get(tuple(seq[-o:]))
                if token is not None:
                    break
            if token is None:
                break
            out.append(token)
            seq.append(token)
        return out, 1 if out else 0


class CorpusArm:
    """A `CorpusDrafter` (optionally context lookup only) as a replay arm: proposal and match length."""

    def __init__(self, drafter) -> None:
        self.drafter = drafter

    def propose(self, ids: list[int], n: int) -> tuple[list[int], int]:
        tokens = self.drafter.propose(ids, n)
        return list(tokens), int(self.drafter.last_match_length)


# ---------------------------------------------------------------------------------------------------------------------
# estimates a policy may read
# ---------------------------------------------------------------------------------------------------------------------
def match_class(m: int) -> int:
    return max(0, int(m) - 1).bit_length()


@dataclass
class Rates:
    """Per (arm, class) acceptance by drafted position, shrunk towards the arm's rates, then 1/2 (as DraftLength)."""

    weight: float = 2.0
    tried: dict = field(default_factory=lambda: defaultdict(lambda: [0.0] * 64))
    hit: dict = field(default_factory=lambda: defaultdict(lambda: [0.0] * 64))

    def observe(self, key, drafted: int, accepted: int, cls: int | None = None) -> None:
        reached = min(accepted + 1, drafted)
        for k in [(key, None)] + ([(key, cls)] if cls is not None else []):
            for j in range(reached):
                self.tried[k][j] += 1
                self.hit[k][j] += 1 if j < accepted else 0

    def rates(self, key, n: int, cls: int | None = None, prior: float = 0.5) -> list[float]:
        out, mean = [], prior
        t, h = self.tried[(key, None)], self.hit[(key, None)]
        for j in range(n):
            mean = (h[j] + self.weight * mean) / (t[j] + self.weight)
            out.append(mean)
        if cls is None:
            return out
        t, h = self.tried[(key, cls)], self.hit[(key, cls)]
        return [(h[j] + self.weight * p) / (t[j] + self.weight) for j, p in enumerate(out)]


def best_length(rates: list[float], cost: Callable[[int], float]) -> tuple[int, float, float]:
    """(n, expected tokens, value = expected / cost(n)) maximising the value over n = 1..len(rates)."""
    best, best_value, best_expected = 1, -1.0, 1.0
    expected, survive = 1.0, 1.0
    for n in range(1, len(rates) + 1):
        survive *= rates[n - 1]
        expected += survive
        value = expected / cost(n)
        if value >= best_value:
            best, best_value, best_expected = n, value, expected
    return best, best_expected, best_value


# ---------------------------------------------------------------------------------------------------------------------
# the replay of one call
# ---------------------------------------------------------------------------------------------------------------------
@dataclass
class Round:
    arm: str
    drafted: int
    accepted: int
    seconds: float


def greedy_proposal(record: dict, arm: str, t: int, n: int) -> list[int]:
    """A greedy model arm's draft of `n` tokens at answer position `t` from its recorded next tokens: the answer's
    tokens while they match, then its mismatching token, then placeholders (-1: never accepted)."""
    nxt, answer, start = record["greedy_next"][arm], record["answer"], len(record["prompt"]) - 1
    out: list[int] = []
    while len(out) < n and t + len(out) < len(answer) and int(nxt[start + t + len(out)]) == answer[t + len(out)]:
        out.append(answer[t + len(out)])
    if len(out) < n:
        p = start + t + len(out)
        out.append(int(nxt[p]) if p < len(nxt) else -1)
    return out + [-1] * (n - len(out))


class State:
    """What a policy sees before a round: the context, each arm's proposal (model-free arms: computed; model arms: the
    recording), the rates learnt so far, costs, and each model arm's lag (tokens its cache lacks)."""

    def __init__(self, replay: Replay, record: dict, t: int) -> None:
        self.replay, self.record, self.t = replay, record, t
        self.ids = record["prompt"] + record["answer"][:t]
        self._proposals: dict[str, tuple[list[int], int]] = {}

    def proposal(self, arm: str, n: int) -> tuple[list[int], int]:
        if arm not in self._proposals:
            r = self.replay
            if arm in r.model_arms:
                self._proposals[arm] = (greedy_proposal(self.record, arm, self.t, r.cap), 0)
            else:
                self._proposals[arm] = r.copiers[arm].propose(self.ids, r.copier_tokens)
        tokens, m = self._proposals[arm]
        return tokens[:n], m

    def accepted(self, tokens: list[int]) -> int:
        answer = self.record["answer"]
        a = 0
        while a < len(tokens) and self.t + a < len(answer) and tokens[a] == answer[self.t + a]:
            a += 1
        return a

    def model_cost(self, arm: str, n: int) -> float:
        """Seconds for model arm `arm` to catch up and draft `n` tokens (its prompt prefill apart)."""
        r = self.replay
        lag = max(1, len(self.ids) - r.seen[arm]) if arm in r.seen else None
        if lag is None:
            return r.costs.f(arm, 1) * n
        return r.costs.f(arm, lag) + r.costs.f(arm, 1) * (n - 1)

    def prefill_cost(self, arm: str) -> float:
        r = self.replay
        return 0.0 if arm in r.seen else r.costs.drafter_prefill[arm] * len(self.ids)


class Replay:
    """Replays calls over recordings with a policy (`policy(state) -> (arm or None, n)`; None: a plain step)."""

    def __init__(
        self,
        records: list[dict],
        costs: Costs,
        *,
        model_arms: Sequence[str],
        copiers: dict[str, object],
        cap: int = 8,
        copier_tokens: int = 16,
        recycling: Recycling | None = None,
    ) -> None:
        self.records, self.costs, self.model_arms = records, costs, list(model_arms)
        self.copiers = dict(copiers)
        self.cap, self.copier_tokens = cap, copier_tokens
        self.recycling = recycling
        if recycling is not None:
            self.copiers["recycling"] = recycling
        self.rates = Rates()
        self.seen: dict[str, int] = {}
        self.streak: dict[str, bool | None] = {}
        self.use_streak = False

    @property
    def arms(self) -> list[str]:
        return self.model_arms + list(self.copiers)

    def plain_seconds(self, record: dict) -> float:
        return self.costs.target_prefill * len(record["prompt"]) + (len(record["answer"]) - 1) * (
            self.costs.v(1) + self.costs.overhead
        )

    def call(self, record: dict, policy: Callable[[State], tuple[str | None, int]]) -> tuple[float, list[Round]]:
        answer, top = record["answer"], record["top_k"]
        prompt_len = len(record["prompt"])
        self.seen, self.streak = {}, {}
        seconds = self.costs.target_prefill * prompt_len  # the first round: the prompt's pass, one token
        if self.recycling is not None and getattr(self, "learn_prompt", False):
            self.recycling.learn(record["prompt"], top, range(prompt_len - 1))
        rounds: list[Round] = []
        t = 1
        while t < len(answer):
            state = State(self, record, t)
            budget = min(self.cap, len(answer) - t - 1)
            arm, n = policy(state) if budget > 0 else (None, 0)
            n = min(n, budget)
            cost = self.costs.overhead
            drafted = accepted = 0
            if arm is not None and n > 0:
                tokens, m = state.proposal(arm, n if arm in self.model_arms else min(self.copier_tokens, budget))
                if arm in self.model_arms:
                    cost += self.prefill_cost_and_mark(state, arm) + state.model_cost(arm, n)
                else:
                    cost += self.costs.copier
                    tokens = tokens[:n]
                drafted = len(tokens)
                accepted = state.accepted(tokens)
                if arm in self.model_arms:
                    self.seen[arm] = len(state.ids) + accepted  # its cache holds the accepted drafted tokens
            cost += self.costs.v(drafted + 1)
            self.observe(state, arm, drafted, accepted, policy)
            if self.recycling is not None:
                p0 = prompt_len + t - 1
                self.recycling.learn(record["prompt"] + answer, top, range(p0, p0 + accepted + 1))
            seconds += cost
            rounds.append(Round(arm or "plain", drafted, accepted, cost))
            t += accepted + 1
        return seconds, rounds

    def prefill_cost_and_mark(self, state: State, arm: str) -> float:
        if arm in self.seen:
            return 0.0
        cost = self.costs.drafter_prefill[arm] * len(state.ids)
        self.seen[arm] = len(state.ids)
        return cost

    def context_class(self, arm: str, m: int) -> object:
        """The class an arm's rates are kept in this round: its match class (copiers), with `streak` on, paired with
        whether its last decided proposal had its first token accepted (None: unknown)."""
        cls = match_class(m) if arm in self.copiers else None
        return (cls, self.streak.get(arm)) if self.use_streak else cls

    def observe(self, state: State, arm: str | None, drafted: int, accepted: int, policy) -> None:
        """Full information for model-free arms (what they would have had accepted, up to what the pass decided), the
        round's own arm as drafted."""
        outcome: dict[str, bool | None] = dict.fromkeys(self.model_arms)
        if arm is not None and drafted:
            cls = self.context_class(arm, state.proposal(arm, 1)[1])
            self.rates.observe(arm, drafted, accepted, cls)
            outcome[arm] = accepted > 0
        decided = accepted + 1  # tokens of the answer this round fixed
        for name in self.copiers:
            tokens, m = state.proposal(name, self.copier_tokens)
            if not tokens:
                outcome[name] = None
                continue
            a = state.accepted(tokens[:decided])
            outcome[name] = a > 0
            if name == arm:
                continue
            d = min(len(tokens), decided) if a < decided else decided
            # censored: positions beyond `decided` are unknown; count what is known
            self.rates.observe(name, d if a < d else a, a, self.context_class(name, m))
        self.streak = outcome

    def run(self, policy, records: list[dict] | None = None) -> dict:
        per_task: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        arms: dict[str, int] = defaultdict(int)
        tokens = rounds_n = 0
        for record in records or self.records:
            seconds, rounds = self.call(record, policy)
            per_task[record["task"]][0] += self.plain_seconds(record)
            per_task[record["task"]][1] += seconds
            for r in rounds:
                arms[r.arm] += 1
            tokens += len(record["answer"])
            rounds_n += len(rounds)
        out = {task: p / s for task, (p, s) in per_task.items()}
        out["overall"] = sum(p for p, _ in per_task.values()) / sum(s for _, s in per_task.values())
        out["arms"] = dict(arms)
        out["tokens_per_round"] = tokens / max(1, rounds_n)
        return out


# ---------------------------------------------------------------------------------------------------------------------
# policies
# ---------------------------------------------------------------------------------------------------------------------
def optimistic(rates: list[float], tried: list[float], bonus: float) -> list[float]:
    """Rates raised by ``bonus / sqrt(T_j + 1)`` (at most 1): an arm few rounds measured looks better than it has."""
    return [min(1.0, p + bonus / (t + 1) ** 0.5) for p, t in zip(rates, tried, strict=False)]


def arm_value(state: State, arm: str, cap: int, amortize: bool = False, bonus: float = 0.0) -> tuple[float, int]:
    """(expected tokens per second, draft length) of `arm` this round, from the rates learnt so far. A model arm's
    prompt prefill, not paid yet in this call, is charged in full (or, with `amortize`, its share per expected token
    over the tokens left)."""
    r = state.replay
    costs = r.costs
    if arm in r.model_arms:
        rates = r.rates.rates(arm, cap, r.context_class(arm, 0) if r.use_streak else None)
        if bonus:
            rates = optimistic(rates, r.rates.tried[(arm, None)], bonus)
        pre = state.prefill_cost(arm)
        left = max(1, len(state.record["answer"]) - state.t)

        def cost(n: int) -> float:
            share = pre * expected(rates, n) / left if amortize else pre
            return share + state.model_cost(arm, n) + costs.v(n + 1) + costs.overhead

        n, _, value = best_length(rates, cost)
        return value, n
    tokens, m = state.proposal(arm, r.copier_tokens)
    if not tokens:
        return -1.0, 0
    rates = r.rates.rates(arm, min(len(tokens), cap), r.context_class(arm, m))
    n, _, value = best_length(rates, lambda n: costs.copier + costs.v(n + 1) + costs.overhead)
    return value, n


def expected(rates: list[float], n: int) -> float:
    out, survive = 1.0, 1.0
    for j in range(n):
        survive *= rates[j]
        out += survive
    return out


def plain_value(state: State) -> float:
    return 1.0 / (state.replay.costs.v(1) + state.replay.costs.overhead)


def fixed(arm: str, cap: int = 8):
    def policy(state: State):
        value, n = arm_value(state, arm, cap)
        return (arm, n) if n > 0 else (None, 0)

    return policy


def throughput(
    arms: Sequence[str] | None = None, cap: int = 8, plain: bool = True, amortize: bool = False, bonus: float = 0.0
):
    """Each round, the arm (and length) with the highest expected tokens per second; a plain step if none beats it."""

    def policy(state: State):
        best, best_n, best_value = None, 0, plain_value(state) if plain else -1.0
        for arm in arms or state.replay.arms:
            value, n = arm_value(state, arm, cap, amortize, bonus)
            if n > 0 and value > best_value:
                best, best_n, best_value = arm, n, value
        return best, best_n

    return policy


def precedence(copier: str, model: str, threshold: int = 4, cap: int = 8):
    """Serving engines' rule: the copier when its match is at least `threshold` tokens, else the model drafter."""

    def policy(state: State):
        tokens, m = state.proposal(copier, state.replay.copier_tokens)
        if tokens and m >= threshold:
            return copier, min(len(tokens), cap)
        return model, arm_value(state, model, cap)[1]

    return policy


def oracle(cap: int = 8):
    """Per round in hindsight: the arm and length whose round adds the most tokens per second (greedy per round)."""

    def policy(state: State):
        r = state.replay
        best, best_n, best_value = None, 0, plain_value(state)
        for arm in r.arms:
            tokens, _ = state.proposal(arm, cap)
            for n in range(1, len(tokens) + 1):
                a = state.accepted(tokens[:n])
                if arm in r.model_arms:
                    cost = state.prefill_cost(arm) + state.model_cost(arm, n)
                else:
                    cost = r.costs.copier
                value = (a + 1) / (cost + r.costs.v(n + 1) + r.costs.overhead)
                if value > best_value:
                    best, best_n, best_value = arm, n, value
        return best, best_n

    return policy


def variants(models: list[str]) -> list[tuple[str, dict, Callable]]:
    """The replayed methods: (name, replay settings, policy). Settings: ``copiers`` (model-free arms of the pool),
    ``warm`` (token recycling starts from the shipped table), ``order`` (its key: the last 1 or 2 tokens)."""
    base = {"copiers": ("prompt_lookup", "corpus_all", "recycling"), "warm": True, "order": 1, "streak": False}
    streak = {**base, "streak": True}
    out = [(f"fixed[{m}]", base, fixed(m)) for m in models]
    out += [(f"fixed[{a}]", base, fixed(a)) for a in base["copiers"]]
    out += [("fixed[recycling] (cold)", {**base, "warm": False}, fixed("recycling"))]
    out += [("fixed[recycling] (order 2)", {**base, "order": 2}, fixed("recycling"))]
    out += [
        ("throughput", base, throughput()),
        ("throughput (prefill amortised)", base, throughput(amortize=True)),
        ("throughput (cold recycling)", {**base, "warm": False}, throughput()),
        ("throughput (optimism 0.5)", base, throughput(bonus=0.5)),
        ("throughput (optimism 0.5, amortised)", base, throughput(bonus=0.5, amortize=True)),
        ("throughput (optimism 1.0, amortised)", base, throughput(bonus=1.0, amortize=True)),
        ("throughput (streak)", streak, throughput()),
        ("throughput (streak, optimism 0.5, amortised)", streak, throughput(bonus=0.5, amortize=True)),
        ("throughput (no recycling)", {**base, "copiers": ("prompt_lookup", "corpus_all")}, throughput()),
        ("throughput (no prompt lookup)", {**base, "copiers": ("corpus_all", "recycling")}, throughput()),
        ("throughput (model + corpus)", {**base, "copiers": ("corpus_all",)}, throughput()),
        (
            "throughput (optimism 0.5, amortised, no recycling)",
            {**base, "copiers": ("prompt_lookup", "corpus_all")},
            throughput(bonus=0.5, amortize=True),
        ),
        (
            "throughput (optimism 0.5, amortised, no prompt lookup)",
            {**base, "copiers": ("corpus_all", "recycling")},
            throughput(bonus=0.5, amortize=True),
        ),
        (
            "throughput (optimism 0.5, amortised, corpus only)",
            {**base, "copiers": ("corpus_all",)},
            throughput(bonus=0.5, amortize=True),
        ),
        (
            "throughput (optimism 0.5, amortised, corpus only, int8 only)",
            {**base, "copiers": ("corpus_all",), "models": models[1:]},
            throughput(bonus=0.5, amortize=True),
        ),
        (
            "throughput (optimism 0.5, amortised, no prompt lookup, int8 only)",
            {**base, "copiers": ("corpus_all", "recycling"), "models": models[1:]},
            throughput(bonus=0.5, amortize=True),
        ),
        (
            "throughput (optimism 0.5, amortised, recycling learns the prompt)",
            {**base, "learn_prompt": True},
            throughput(bonus=0.5, amortize=True),
        ),
        ("fixed[recycling] (learns the prompt)", {**base, "learn_prompt": True}, fixed("recycling")),
        ("throughput (first model only)", {**base, "models": models[:1]}, throughput(bonus=0.5, amortize=True)),
        *[(f"precedence (corpus >= 4, else {m})", base, precedence("corpus_all", m)) for m in models],
        ("oracle per round", base, oracle()),
    ]
    return out


def build(records, costs, models: list[str], settings: dict, warm_table: dict | None) -> Replay:
    from hf_metasd.benchmark.run import QWEN_CORPUS_DIR
    from hf_metasd.drafters import CorpusDrafter

    copiers: dict[str, object] = {}
    if "prompt_lookup" in settings["copiers"]:
        copiers["prompt_lookup"] = PromptLookupArm()
    if "corpus_all" in settings["copiers"]:
        copiers["corpus_all"] = CorpusArm(CorpusDrafter.from_folder(QWEN_CORPUS_DIR, context_lookup=True))
    recycling = None
    if "recycling" in settings["copiers"]:
        recycling = Recycling(order=settings["order"])
        if settings["warm"] and warm_table:
            recycling.next.update({(k,): v for k, v in warm_table.items()})
    replay = Replay(records, costs, model_arms=settings.get("models", models), copiers=copiers, recycling=recycling)
    replay.use_streak = settings["streak"]
    replay.learn_prompt = settings.get("learn_prompt", False)
    return replay


class PromptLookupArm:
    """Prompt lookup (transformers' n-gram search, up to 2-grams) as a replay arm; its match length is the n-gram's."""

    def propose(self, ids: list[int], n: int) -> tuple[list[int], int]:
        from hf_metasd.drafters import prompt_lookup_candidates

        tokens = prompt_lookup_candidates(torch.tensor(ids), n, 2).tolist()
        return tokens, 0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("recordings", type=Path)
    p.add_argument("--costs", type=Path, required=True)
    p.add_argument("--warm", type=Path, default=None, help="a token recycling table folder (table.safetensors)")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    p.add_argument("--only", default="", help="run only the methods whose name contains this")
    args = p.parse_args(argv)
    from hf_metasd.drafters import TokenRecyclingDrafter

    store = torch.load(args.recordings)
    costs = Costs.load(args.costs)
    records = store["prompts"]
    models = list(records[0]["greedy_next"])
    warm = None
    if args.warm is not None:
        tokens, following = TokenRecyclingDrafter.read_table(args.warm).rows()
        warm = dict(zip(tokens.tolist(), following.tolist(), strict=True))
    results = {}
    for name, settings, policy in variants(models):
        if args.only not in name:
            continue
        result = build(records, costs, models, settings, warm).run(policy)
        results[name] = result
        shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}
        print(f"{name}: {shown}", flush=True)
    if args.out is not None:
        args.out.write_text(
            json.dumps({"prompts": len(records), "costs": str(args.costs), "results": results}, indent=1)
        )
    return results


if __name__ == "__main__":
    main()
