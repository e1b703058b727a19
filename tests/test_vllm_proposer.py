"""`hf_metasd.vllm.MetaSDProposer` without vLLM: driven with `propose`'s exact argument shapes (a ``list[list[int]]``
of sampled tokens, int32 ``(max_num_reqs,)`` counts and ``(max_num_reqs, max_model_len)`` tokens) by a stand-in for
vLLM's persistent batch, whose rows condense when a request finishes and take new requests as they join. Requests'
states never mix, drafts stay within k, empty drafts where no arm drafts, the accepted-count bookkeeping, the pool a
folder brings, and every error message."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import VOCAB, tiny_llama

import hf_metasd.vllm.proposer as proposer_module
from hf_metasd import DrafterCompatibilityError, InvalidPoolError, MetaSDConfigError, MetaSDTypeError
from hf_metasd.drafters import CorpusDrafter, FeatureHeadDrafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.drafters.candidates import CandidateDrafter
from hf_metasd.feature_head import FeatureHead, FeatureHeadConfig
from hf_metasd.pool import DrafterPool
from hf_metasd.vllm import MetaSDProposer, RequestState, RequestTable

K = 3
MAX_LEN = 96


def vllm_config(k: int = K, max_model_len: int = MAX_LEN, **options):
    """The parts of vLLM's `VllmConfig` the proposer reads; `options` go to ``additional_config["hf_metasd"]``."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(hf_config=SimpleNamespace(vocab_size=VOCAB), max_model_len=max_model_len),
        scheduler_config=SimpleNamespace(max_num_seqs=8),
        additional_config={"hf_metasd": options} if options else {},
    )


class Step(CandidateDrafter):
    """A model-free arm that drafts the next tokens of a walk ``t -> t + step`` from the last token."""

    replayable = True

    def __init__(self, step: int, name: str) -> None:
        super().__init__(name)
        self.step = step

    def candidates(self, input_ids, num_tokens, is_allowed):
        last = int(input_ids[0, -1])
        return torch.tensor([(last + self.step * (j + 1)) % VOCAB for j in range(num_tokens)])


UP, DOWN = (lambda t: (t + 1) % VOCAB), (lambda t: (t - 1) % VOCAB)


class Batch:
    """vLLM's persistent batch as `propose` sees it: a row per running request, each row's tokens and count; a
    request that finishes leaves a hole that the last row moves into (vLLM's `condense`), a request that joins takes
    the next row after its prefill step, which sampled its first token. The target continues each request by its own
    rule (``UP`` or ``DOWN``): it accepts a draft's tokens while they follow the rule, then adds the rule's token."""

    def __init__(self, rows: int = 8) -> None:
        self.tokens = np.zeros((rows, MAX_LEN), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self.names: list[str] = []
        self.rules: dict[str, object] = {}
        self.sampled: list[list[int]] = []
        self.drafts: dict[str, list[list[int]]] = {}  # every draft each request got
        self.accepted = 0

    def join(self, name: str, prompt: list[int], rule) -> None:
        row, seq = len(self.names), [*prompt, rule(prompt[-1])]
        self.tokens[row, : len(seq)], self.lengths[row] = seq, len(seq)
        self.names.append(name)
        self.rules[name] = rule
        self.sampled.append([seq[-1]])
        self.drafts[name] = []

    def finish(self, name: str) -> None:
        row, last = self.names.index(name), len(self.names) - 1
        if row != last:
            self.tokens[row], self.lengths[row] = self.tokens[last], self.lengths[last]
            self.names[row], self.sampled[row] = self.names[last], self.sampled[last]
        self.names.pop()
        self.sampled.pop()

    def step(self, proposer: MetaSDProposer) -> list[list[int]]:
        drafts = proposer.propose([list(s) for s in self.sampled], self.lengths, self.tokens, slot_mappings=None)
        assert len(drafts) == len(self.names)
        for row, (name, draft) in enumerate(zip(self.names, drafts)):
            rule, last = self.rules[name], int(self.tokens[row, self.lengths[row] - 1])
            self.drafts[name].append(draft)
            out = []
            for token in draft:
                if token != rule(last):
                    break
                out.append(token)
                last = token
            self.accepted += len(out)
            out.append(rule(last))
            n = int(self.lengths[row])
            self.tokens[row, n : n + len(out)] = out
            self.lengths[row] = n + len(out)
            self.sampled[row] = out
        return drafts


def _follows(draft: list[int], rule, start: int) -> bool:
    return draft[0] == rule(start)


def step_pool(**kwargs) -> DrafterPool:
    settings = {"policy": "ucb", "policy_kwargs": {"beta": 0.0}, "reward": "be", **kwargs}
    return DrafterPool([Step(1, "up"), Step(-1, "down")], **settings)


@pytest.fixture
def step_proposer(monkeypatch):
    """A proposer over the two walks (`Step` arms: no pool file holds them), greedy UCB on BE."""

    def build(**kwargs):
        monkeypatch.setattr(proposer_module, "load_pool", lambda *args, **kw: step_pool(**kwargs))
        return MetaSDProposer(vllm_config())

    return build


# ---------------------------------------------------------------------------------------------------------------------
# per request: rows that reorder, finish and join never mix two requests' states
# ---------------------------------------------------------------------------------------------------------------------
def test_requests_whose_best_arms_differ_keep_their_own_values_through_finish_join_and_reorder(step_proposer):
    proposer, batch = step_proposer(), Batch()
    batch.join("a", [10, 11, 12], UP)
    batch.join("b", [70, 69, 68], DOWN)
    for _ in range(5):
        batch.step(proposer)
    batch.finish("a")  # b moves to row 0
    batch.join("c", [30, 31, 32], UP)
    batch.join("d", [80, 79, 78], DOWN)
    for _ in range(4):
        batch.step(proposer)
    batch.finish("c")  # d moves to row 1
    batch.join("e", [20, 21, 22], DOWN)  # joins where c was, with c's rule's opposite
    for _ in range(4):
        batch.step(proposer)
    for name, drafts in batch.drafts.items():
        # a fresh policy tries `up` then `down` (greedy UCB: untried arms first), then keeps its request's best
        assert [d[0] - d[1] for d in drafts[:2]] == [-1, 1], name
        best = "up" if batch.rules[name] is UP else "down"
        later = ["up" if d[1] == d[0] + 1 else "down" for d in drafts[2:]]
        assert later == [best] * len(later), (name, drafts)
    assert len(list(proposer.requests)) == 5  # every request its own state (finished ones kept until evicted)
    for state in proposer.requests:
        up, down = state.policy.means()
        assert {up, down} == {1.0, 0.0}  # each learnt its own: one walk always accepted, the other never


def test_two_requests_with_identical_histories_are_told_apart_by_what_their_drafts_accepted():
    table = RequestTable(capacity=8)
    tokens = np.zeros((2, 16), dtype=np.int32)
    tokens[:, :3] = [4, 5, 6]
    first, second = table.new("first"), table.new("second")
    table.store(first, tokens[0, :3], row=1, call=1, draft=[7, 8])  # the row hints point the wrong way
    table.store(second, tokens[1, :3], row=0, call=1, draft=[9, 9])
    tokens[0, 3:5], tokens[1, 3:4] = [7, 1], [2]  # row 0 accepted 7 (only `first` drafted it); row 1 accepted none
    matched = table.match([[7, 1], [2]], np.array([5, 4], dtype=np.int32), tokens)
    assert [s.policy for s in matched] == ["first", "second"]


def test_requests_that_nothing_tells_apart_keep_their_rows():
    table = RequestTable(capacity=8)
    tokens = np.zeros((2, 16), dtype=np.int32)
    tokens[:, :5] = [4, 5, 6, 7, 1]
    first, second = table.new("first"), table.new("second")
    table.store(first, tokens[0, :5], row=1, call=1, draft=[])
    table.store(second, tokens[1, :5], row=0, call=1, draft=[])
    tokens[:, 5] = 3
    matched = table.match([[3], [3]], np.array([6, 6], dtype=np.int32), tokens)
    assert [s.policy for s in matched] == ["second", "first"]  # not by age: each keeps the row it had


@pytest.mark.parametrize(
    ("row", "sampled", "continues"),
    [
        ([1, 2, 3, 4, 5, 6], [5, 6], True),  # accepted the drafted 5, then sampled 6
        ([1, 2, 3, 4, 9, 6], [6], False),  # one token more than the step appended: a call was missed
        ([1, 2, 3, 4, 7, 6], [7, 6], False),  # "accepted" 7, which its draft never proposed
        ([1, 2, 3, 8, 6], [6], False),  # another history
    ],
)
def test_a_row_continues_a_kept_request_only_by_the_rule(row, sampled, continues):
    table = RequestTable(capacity=8)
    tokens = np.zeros((1, 16), dtype=np.int32)
    tokens[0, :4] = [1, 2, 3, 4]
    state = table.new("kept")
    table.store(state, tokens[0, :4], row=0, call=1, draft=[5])
    tokens[0, : len(row)] = row
    [matched] = table.match([sampled], np.array([len(row)], dtype=np.int32), tokens)
    assert (matched is state) == continues


def test_the_table_keeps_at_most_its_capacity_dropping_the_least_recently_seen():
    table = RequestTable(capacity=2)
    for call in (1, 2, 3):
        table.store(table.new(call), np.arange(call, dtype=np.int32), row=0, call=call)
    table.evict()
    assert sorted(s.policy for s in table) == [2, 3]


def test_rows_with_nothing_sampled_draft_nothing_and_leave_states_alone(step_proposer):
    proposer = step_proposer()
    tokens = np.zeros((4, MAX_LEN), dtype=np.int32)
    tokens[0, :4], tokens[1, :2] = [1, 2, 3, 4], [5, 6]
    counts = np.array([4, 2, 0, 0], dtype=np.int32)
    assert proposer.propose([[4], []], counts, tokens) == [[5, 6, 7], []]  # row 1: a chunk of a prefill
    assert len(proposer.requests) == 1


# ---------------------------------------------------------------------------------------------------------------------
# drafts: within k, within the model length, empty where no arm drafts
# ---------------------------------------------------------------------------------------------------------------------
def test_drafts_never_exceed_k_nor_the_room_left_before_max_model_len(step_proposer):
    proposer = step_proposer()
    tokens = np.zeros((3, MAX_LEN), dtype=np.int32)
    counts = np.array([5, MAX_LEN - 2, MAX_LEN], dtype=np.int32)
    drafts = proposer.propose([[1], [1], [1]], counts, tokens)
    assert [len(d) for d in drafts] == [K, 2, 0]


def test_no_draft_where_no_arm_has_anything_to_propose():
    proposer = MetaSDProposer(vllm_config(policy="ucb", reward="be"))  # the default pool: prompt lookup alone
    assert proposer.arm_names == ["prompt_lookup"]
    tokens = np.zeros((2, MAX_LEN), dtype=np.int32)
    tokens[0, :5], tokens[1, :6] = [1, 2, 3, 4, 5], [1, 2, 3, 1, 2, 7]
    drafts = proposer.propose([[5], [7]], np.array([5, 6], dtype=np.int32), tokens)
    assert drafts == [[], []]  # no n-gram repeats: prompt lookup abstains, and there is no other arm
    tokens[1, :6] = [1, 2, 3, 9, 1, 2]
    assert proposer.propose([[2]], np.array([6], dtype=np.int32), tokens[1:]) == [[3, 9, 1]]


def test_the_default_pool_without_the_embedded_tokenizer_is_prompt_lookup_and_the_no_draft_arm():
    proposer = MetaSDProposer(vllm_config())
    assert proposer.arm_names == ["prompt_lookup", "no_draft"]
    assert (proposer.policy_name, proposer.reward) == ("ucb_scaled", "speed")


# ---------------------------------------------------------------------------------------------------------------------
# what the policy learns: the accepted counts, the speed reward's costs, the calibration step
# ---------------------------------------------------------------------------------------------------------------------
def test_the_accepted_count_of_each_draft_is_len_sampled_minus_one(step_proposer):
    proposer, batch = step_proposer(), Batch()
    batch.join("a", [10, 11, 12], UP)
    batch.join("b", [50, 49, 48], DOWN)
    for _ in range(4):
        batch.step(proposer)
    proposer.propose([list(s) for s in batch.sampled], batch.lengths, batch.tokens)  # learns the last round
    arms = proposer.summary()["arms"]
    assert sum(a["accepted"] for a in arms.values()) == batch.accepted
    assert arms["up"]["drafted"] + arms["down"]["drafted"] == sum(len(d) for ds in batch.drafts.values() for d in ds)
    # `a` walks up: up, down (its policy tries both), up, up; `b` walks down: up, down, down, down
    assert arms == {
        "up": {"rounds": 4, "drafted": 12, "accepted": 9},
        "down": {"rounds": 4, "drafted": 12, "accepted": 9},
    }
    state = next(s for s in proposer.requests if s.history[0] == 10)
    assert (state.policy.counts, state.policy.sums) == ([3, 1], [3.0, 0.0])  # BE: 3/3 for up, 0/3 for down


def test_speed_calibrates_with_a_plain_step_then_rewards_tokens_per_step_time(step_proposer):
    times = itertools.count(0.0, 2.0)  # every step takes 2 s, whatever the arm
    proposer = step_proposer(reward="speed")
    proposer.clock = lambda: next(times)
    assert proposer.arm_names == ["up", "down", "no_draft"]
    batch = Batch()
    batch.join("a", [10, 11, 12], UP)
    assert batch.step(proposer) == [[]]  # no plain step measured yet: the first round is one
    assert batch.step(proposer) == [[15, 16, 17]]  # then the untried arms, in order
    batch.step(proposer)
    [state] = list(proposer.requests)
    # speed = (a + 1) / (k + 1) * c_plain / c_arm: the plain step 1 / 4, `up` with all 3 accepted 4 / 4; after a
    # drafting round the no-draft arm's 1 / 4 is also a side observation (UCB learns those), as in `generate`
    assert state.policy.counts == [1, 0, 2]
    assert state.policy.sums == [1.0, 0.0, 0.5]
    assert proposer.summary()["step_seconds"] == {"up": 2.0, "down": None, "no_draft": 2.0}


# ---------------------------------------------------------------------------------------------------------------------
# a pool from a folder, under the untrusted-data rules; what is refused, and the messages
# ---------------------------------------------------------------------------------------------------------------------
def test_a_saved_pool_brings_its_arms_policy_reward_and_priors(tmp_path):
    corpus = CorpusDrafter.from_sequences([[1, 2, 3, 4, 5, 6, 7]], name="docs")
    priors = {"docs": 0.5, "no_draft": 0.25}
    DrafterPool([corpus, PromptLookupDrafter()], policy="ucb", reward="speed", priors=priors).save_pretrained(tmp_path)
    proposer = MetaSDProposer(vllm_config(pool=str(tmp_path)))
    assert proposer.arm_names == ["docs", "prompt_lookup", "no_draft"]
    assert (proposer.policy_name, proposer.reward, proposer.prior_means) == ("ucb", "speed", [0.5, None, 0.25])
    tokens = np.zeros((1, MAX_LEN), dtype=np.int32)
    tokens[0, :4] = [9, 9, 2, 3]
    proposer.costs.observe(2, 1.0)  # a plain step is measured: no calibration round
    assert proposer.propose([[3]], np.array([4], dtype=np.int32), tokens) == [[4, 5, 6]]
    [state] = list(proposer.requests)
    assert state.policy.prior_means == [0.5, None, 0.25]
    other = MetaSDProposer(vllm_config(pool=str(tmp_path), policy="ucb_v", reward="be"))  # options override it
    assert (other.policy_name, other.policy_kwargs, other.reward, other.prior_means) == ("ucb_v", {}, "be", None)


@pytest.mark.parametrize("kind", ["assistant_model", "feature_head"])
def test_model_drafters_and_feature_heads_are_refused_before_any_weight_is_read(target, tmp_path, monkeypatch, kind):
    if kind == "assistant_model":
        drafter = ModelDrafter(tiny_llama(2, layers=1), name="small")
    else:
        torch.manual_seed(0)
        head = FeatureHead(FeatureHeadConfig.for_target(target, layer_ids=(1,)), target.get_input_embeddings())
        drafter = FeatureHeadDrafter(head, name="small")
    DrafterPool([PromptLookupDrafter(), drafter], target=target).save_pretrained(
        tmp_path / "mixed", store_weights=True
    )
    monkeypatch.setattr(type(drafter), "from_spec", classmethod(lambda *a: pytest.fail("weights were read")))
    with pytest.raises(
        DrafterCompatibilityError,
        match=rf"pool drafter 'small' must be of a model-free kind \['corpus', 'prompt_lookup', 'token_recycling'\] to draft inside "
        rf"vLLM's proposer, but is of kind '{kind}'\. Save the pool without it, or serve a model drafter or feature "
        r"head with vLLM's own `draft_model` or `eagle3` method\.",
    ):
        MetaSDProposer(vllm_config(pool=str(tmp_path / "mixed")))
    DrafterPool([PromptLookupDrafter()]).save_pretrained(tmp_path / "model_free")  # the fix: without it
    assert MetaSDProposer(vllm_config(pool=str(tmp_path / "model_free"))).arm_names == ["prompt_lookup", "no_draft"]


def test_a_hub_pool_is_checked_from_its_config_before_the_rest_is_downloaded(tmp_path, monkeypatch):
    import huggingface_hub

    DrafterPool([ModelDrafter(tiny_llama(2, layers=1), name="small")]).save_pretrained(
        tmp_path / "mixed", store_weights=True
    )
    DrafterPool([PromptLookupDrafter(name="pl")]).save_pretrained(tmp_path / "free")
    asked, real_download = [], huggingface_hub.hf_hub_download

    def config_file(repo_id, filename, revision=None):
        asked.append((repo_id, filename, revision))
        return str(tmp_path / repo_id.split("/")[1] / filename)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", config_file)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("downloaded a refused pool"))
    with pytest.raises(DrafterCompatibilityError, match=r"pool drafter 'small' must be of a model-free kind"):
        MetaSDProposer(vllm_config(pool="org/mixed", revision="v1"))
    assert asked == [("org/mixed", "config.json", "v1")]
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, revision=None: str(tmp_path / "free"))
    assert MetaSDProposer(vllm_config(pool="org/free")).arm_names == ["pl", "no_draft"]
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", real_download)  # it checks the id before any request
    with pytest.raises(
        InvalidPoolError,
        match=r"`pool` must be a pool folder or a Hub repo id, but 'not a repo!' is neither\. Check the path or repo id\.",
    ):
        MetaSDProposer(vllm_config(pool="not a repo!"))


def test_a_pool_built_in_memory_with_a_model_drafter_is_refused_too(monkeypatch):
    pool = DrafterPool([ModelDrafter(tiny_llama(2, layers=1), name="small")])
    monkeypatch.setattr(proposer_module, "load_pool", lambda *args, **kw: pool)
    with pytest.raises(
        DrafterCompatibilityError,
        match=r"pool drafter 'small' must be of a model-free kind \['corpus', 'prompt_lookup', 'token_recycling'\] to draft inside "
        r"vLLM's proposer, but is of kind 'assistant_model'\. Drop it from the pool\.",
    ):
        MetaSDProposer(vllm_config())


@pytest.mark.parametrize("reward", ["bd", "eal", "cost"])
def test_rewards_that_need_what_vllm_does_not_pass_are_refused(reward):
    with pytest.raises(
        MetaSDConfigError,
        match=rf"`reward` must be one of \['be', 'speed'\] under vLLM, but is '{reward}'\. BD \(and EAL under "
        r"sampling\) needs the target's probabilities and `cost` the per-row drafting time, which vLLM does not pass "
        r'to a proposer: use "speed" or "be" \(`additional_config=\{"hf_metasd": \{"reward": "speed"\}\}`\)\.',
    ):
        MetaSDProposer(vllm_config(reward=reward))
    assert MetaSDProposer(vllm_config(reward="speed")).reward == "speed"  # the fix


def test_options_are_checked():
    with pytest.raises(
        MetaSDConfigError,
        match=r'`additional_config\["hf_metasd"\]` must have keys among \[\'pool\', \'revision\', \'policy\', '
        r"'policy_kwargs', 'reward', 'seed'\], but has 'pol'\. Fix or drop it\.",
    ):
        MetaSDProposer(vllm_config(pol="ucb"))
    assert MetaSDProposer(vllm_config(policy="ucb")).policy_name == "ucb"  # the fix
    config = vllm_config()
    config.additional_config = {"hf_metasd": "path/to/pool"}
    with pytest.raises(
        MetaSDTypeError,
        match=r'`additional_config\["hf_metasd"\]` must be a dict, but is str \'path/to/pool\'\. Pass e\.g\. '
        r'`additional_config=\{"hf_metasd": \{"pool": "path/to/pool"\}\}`\.',
    ):
        MetaSDProposer(config)
    with pytest.raises(
        InvalidPoolError,
        match=r"`pool` must be a pool folder or a Hub repo id, but '\./no/such/pool' does not exist\. Check the path\.",
    ):
        MetaSDProposer(vllm_config(pool="./no/such/pool"))
    with pytest.raises(MetaSDConfigError, match=r"`meta_policy` must be one of"):
        MetaSDProposer(vllm_config(policy="nope"))
    with pytest.raises(
        MetaSDTypeError,
        match=r'`additional_config\["hf_metasd"\]\["seed"\]` must be an int or None, but is \'1\'\. Pass e\.g\. 0\.',
    ):
        MetaSDProposer(vllm_config(seed="1"))
    assert MetaSDProposer(vllm_config(seed=1, policy="random")).seed == 1  # the fix


def test_a_policy_that_cannot_run_on_the_pools_arms_is_refused_at_construction_not_per_request(monkeypatch):
    """Issue 50: ``fixed`` with an arm beyond the pool passed the constructor, then failed inside every request's
    `propose` (vLLM's engine step, after the server started)."""
    monkeypatch.setattr(proposer_module, "load_pool", lambda *args, **kw: step_pool())  # BE: arms `up`, `down`
    with pytest.raises(
        MetaSDConfigError,
        match=r'`additional_config\["hf_metasd"\]` must set a policy that runs on the proposer\'s 2 arms '
        r"\['up', 'down'\], but policy 'fixed' with \{'arm': 5\} fails: `arm` must be < the number of drafters "
        r"\(2\), but is 5\. Pick a drafter index in \[0, 2\)\. Fix `policy` or `policy_kwargs`\.",
    ):
        MetaSDProposer(vllm_config(policy="fixed", policy_kwargs={"arm": 5}))
    proposer = MetaSDProposer(vllm_config(policy="fixed", policy_kwargs={"arm": 1}))  # the fix
    batch = Batch()
    batch.join("a", [10, 11, 12], UP)
    assert [batch.step(proposer) for _ in range(2)] == [[[12, 11, 10]], [[13, 12, 11]]]  # `down`, every round


def test_a_seed_given_twice_is_refused_at_construction():
    with pytest.raises(
        MetaSDConfigError,
        match=r'`additional_config\["hf_metasd"\]` must give the seed once, but sets both `seed` \(1\) and '
        r"`policy_kwargs\[\"seed\"\]` \(2\)\. Drop `policy_kwargs\[\"seed\"\]`: `seed` seeds request n's policy "
        r"with seed \+ n\.",
    ):
        MetaSDProposer(vllm_config(policy="random", policy_kwargs={"seed": 2}, seed=1))
    proposer = MetaSDProposer(vllm_config(policy="random", seed=1))  # the fix
    tokens = np.zeros((1, MAX_LEN), dtype=np.int32)
    tokens[0, :6] = [1, 2, 3, 1, 2, 7]
    proposer.propose([[7]], np.array([6], dtype=np.int32), tokens)  # a request's policy is built


@pytest.mark.parametrize(
    ("value", "shown"), [(None, "NoneType None"), ("beta=1", "str 'beta=1'"), ([1], r"list \[1\]")]
)
def test_policy_kwargs_that_are_not_a_dict_are_refused_with_the_house_message(value, shown):
    with pytest.raises(
        MetaSDTypeError,
        match=r'`additional_config\["hf_metasd"\]\["policy_kwargs"\]` must be a dict of policy settings, but is '
        rf'{shown}\. Pass e\.g\. `\{{"policy_kwargs": \{{"beta": 0\.5\}}\}}`, or leave the key out\.',
    ):
        MetaSDProposer(vllm_config(policy="ucb", policy_kwargs=value))
    assert MetaSDProposer(vllm_config(policy="ucb", policy_kwargs={"beta": 0.5})).policy_kwargs == {"beta": 0.5}


def test_nothing_in_the_package_imports_vllm():
    """vLLM is optional: the proposer only receives what vLLM passes (tests and doctests run without it)."""
    folder = Path(proposer_module.__file__).parent
    imported = set()
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert "vllm" not in imported


def test_a_request_state_starts_empty():
    state = RequestState(policy=None)
    assert (state.arm, state.draft, state.history.shape) == (None, [], (0,))
