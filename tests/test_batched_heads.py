"""Batched MetaSD with drafters that have a model (`hf_metasd.batched`): a feature head reads the target's features
from the shared pass (each row the features of its own kept positions, as the row alone gets them), model drafters
(assistant models, LoRA arms, early exit) draft per row with the row's own copy; and each row's draft length and
clock follow the batch's pass cost by total width (`hf_metasd.batched.lengths`, tested with a fake clock)."""

from __future__ import annotations

import pytest
import torch
from conftest import metasd_greedy, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model
from test_batched import ROWS, _metasd, _plain, left_pad
from test_feature_head_drafter import trained_head
from transformers import StoppingCriteria, StoppingCriteriaList

import hf_metasd.batched.loop
from hf_metasd.batched.lengths import DraftingGuard, PassCosts, RowLengths
from hf_metasd.drafters import CorpusDrafter, Drafter, EarlyExitDrafter, FeatureHeadDrafter, LoraDrafter

MAX_NEW = 16


class StopOnTokens(StoppingCriteria):
    """Fires for a row after any of `tokens`."""

    def __init__(self, tokens: list[int]):
        self.tokens = torch.tensor(tokens)

    def __call__(self, input_ids, scores, **kwargs):
        return torch.isin(input_ids[:, -1], self.tokens)


class RecordingHead(FeatureHeadDrafter):
    """A feature-head drafter whose per-call copies keep what they observe (`copies`: in the order they were made,
    one per row of a batch)."""

    def __init__(self, head, name: str = "head") -> None:
        super().__init__(head, name=name)
        self.copies: list[RecordingHead] = []  # shared by the copies

    def spawn(self, target=None):
        clone = super().spawn(target)
        clone.observed = []
        self.copies.append(clone)
        return clone

    def observe(self, features, next_ids, start):
        super().observe(features, next_ids, start)
        self.observed.append((start, features.clone(), next_ids.clone()))

    def seen(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, features (T, kH), next ids (T,))`` of everything this copy observed, in order."""
        positions = torch.cat([start + torch.arange(f.shape[1]) for start, f, _ in self.observed])
        return (
            positions,
            torch.cat([f[0] for _, f, _ in self.observed]),
            torch.cat([n[0] for _, _, n in self.observed]),
        )


def _half_corpus(target, ids, mask, new: int = 8) -> CorpusDrafter:
    """A corpus of every row's first `new` tokens of plain batched generate (it drafts the first half well)."""
    plain = _plain(target, ids, mask, MAX_NEW)
    rows = [ids[b][mask[b].bool()].tolist() + plain[b, ids.shape[1] : ids.shape[1] + new].tolist() for b in range(3)]
    return CorpusDrafter.from_sequences(rows, name="corpus")


# ---------------------------------------------------------------------- a feature head at B > 1
@pytest.mark.parametrize("batch", [1, 3])
def test_a_feature_head_and_a_corpus_give_plain_batched_generate(target, entry_point, batch):
    ids, mask = left_pad(ROWS if batch == 3 else ROWS[2:])
    corpus = _half_corpus(target, *left_pad(ROWS))
    head = FeatureHeadDrafter(trained_head(target))
    out = _metasd(target, ids, mask, MAX_NEW, [head, corpus], meta_policy="ucb")
    assert torch.equal(out.sequences, _plain(target, ids, mask, MAX_NEW))
    rows = out.metasd.rows if batch > 1 else [out.metasd]
    # the head drafted, and drafts were accepted, in the rows' own rounds
    head_rounds = [(d, a) for row in rows for arm, d, a in zip(row.arms, row.drafted, row.accepted) if arm == 0]
    assert sum(d for d, _ in head_rounds) > 0 and sum(a for _, a in head_rounds) > 0


def test_each_row_s_head_observes_what_the_row_alone_observes(target):
    """Every row's copy of the head observes the features of the same positions, followed by the same ids, as the
    row alone (B = 1, no padding) does; the values agree up to float noise (the batch's pass runs padded rows of
    another shape through other kernels: 1e-5 absolute)."""
    ids, mask = left_pad(ROWS)
    corpus = _half_corpus(target, ids, mask)
    head = RecordingHead(trained_head(target))
    batch = _metasd(target, ids, mask, MAX_NEW, [head, corpus], meta_policy="ucb")
    assert torch.equal(batch.sequences, _plain(target, ids, mask, MAX_NEW)) and len(head.copies) == 3
    for b, row in enumerate(ROWS):
        alone = RecordingHead(trained_head(target))
        out = metasd_greedy(target, torch.tensor([row]), MAX_NEW, assistant_models=[alone, corpus], meta_policy="ucb")
        assert out[0].tolist() == row + batch.sequences[b, ids.shape[1] :].tolist()
        positions, features, next_ids = head.copies[b].seen()
        alone_positions, alone_features, alone_next = alone.copies[0].seen()
        # every kept position but the last token's, in order, each followed by its token
        assert positions.tolist() == alone_positions.tolist() == list(range(len(row) + MAX_NEW - 1))
        assert torch.equal(next_ids, alone_next) and next_ids.tolist() == out[0, 1:].tolist()
        torch.testing.assert_close(features, alone_features, atol=1e-5, rtol=1e-4)
        assert len(head.copies[b].observed) > 1  # over several passes


# ---------------------------------------------------------------------- model drafters at B > 1: per row
def _lora(target):
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(sharpen(tiny_llama(5, layers=1)), lora, adapter_name="code")
    model.add_adapter("math", lora)
    return LoraDrafter.from_peft_model(model.eval())


MODEL_DRAFTERS = {
    "assistant_model": lambda target, copy: [copy],
    "lora": lambda target, copy: _lora(target),
    "early_exit": lambda target, copy: [EarlyExitDrafter(target, num_layers=1)],
}


@pytest.mark.parametrize("kind", sorted(MODEL_DRAFTERS))
def test_model_drafters_draft_per_row_at_batch_size_three(target, target_copy, kind):
    """Each row drafts with its own copy of every model drafter (its own KV cache, of the row without padding)."""
    ids, mask = left_pad(ROWS)
    pool = [*MODEL_DRAFTERS[kind](target, target_copy), _half_corpus(target, ids, mask)]
    out = _metasd(target, ids, mask, MAX_NEW, pool, meta_policy="fixed")  # arm 0: a model drafter every round
    assert torch.equal(out.sequences, _plain(target, ids, mask, MAX_NEW))
    assert all(sum(row.drafted) > 0 for row in out.metasd.rows)
    if kind == "assistant_model":  # a copy of the target: every draft is accepted
        assert all(row.accepted == row.drafted for row in out.metasd.rows)


def test_an_assistant_model_per_row_through_both_entry_points(target, target_copy, drafters, entry_point):
    ids, mask = left_pad(ROWS)
    out = _metasd(target, ids, mask, MAX_NEW, [drafters[0], target_copy, _half_corpus(target, ids, mask)])
    assert torch.equal(out.sequences, _plain(target, ids, mask, MAX_NEW))
    rows = out.metasd.rows
    assert sum(d for row in rows for arm, d in zip(row.arms, row.drafted) if arm < 2) > 0  # the models drafted


@pytest.mark.parametrize("kind", ["feature_head", "model", "early_exit"])
def test_a_row_whose_mask_keeps_no_token_drafts_with_drafters_that_have_a_model(
    target, target_copy, kind, always_drafting
):
    """The row's drafters start from its first token (the prefill round is plain, `hf_metasd.batched.plain`): a
    feature head, an assistant model (an exact copy: every drafted token accepted) and early exit draft it too."""
    ids, mask = left_pad(ROWS)
    mask[1] = 0
    drafter = {
        "feature_head": lambda: FeatureHeadDrafter(trained_head(target)),
        "model": lambda: target_copy,
        "early_exit": lambda: EarlyExitDrafter(target, 1),
    }[kind]()
    kwargs = {"meta_policy": "fixed", "meta_reward": "be", "meta_draft_length": "fixed"}
    out = _metasd(target, ids, mask, MAX_NEW, [drafter], **kwargs)
    assert torch.equal(out.sequences, _plain(target, ids, mask, MAX_NEW))
    assert out.metasd.plain_reason.startswith("the prefill round: row 1's `attention_mask` keeps no token")
    assert out.metasd.plain_tokens == [1, 1, 1] and sum(out.metasd.rows[1].drafted) > 0
    if kind == "model":
        assert all(row.accepted == row.drafted for row in out.metasd.rows)


# ---------------------------------------------------------------------- draft lengths follow the batch's passes
def test_a_row_s_draft_length_follows_the_pass_cost_at_the_batch_size():
    """Passes that cost 8 + T for T tokens in all (a fixed part, then every token): a row's share of a pass of R rows
    verifying k tokens each is 8 / R + k. The same acceptance drafts the cap alone and one token among eight rows."""
    passes = PassCosts(batch_size=8, max_tokens=4)
    for width in range(1, 41):
        passes.observe(1, width, 8.0 + width)
        passes.observe(1, width, 8.0 + width)
    row = RowLengths(1, 4, passes=passes)
    for accepted in [4] * 5 + [1] * 5:
        row.observe_acceptance(0, 4, accepted)
    chosen = {}
    for rows in (1, 2, 4, 8):
        passes.rows = rows
        chosen[rows] = row.choose(0)
        assert row.verification_seconds() == pytest.approx([8 / rows + k for k in range(1, 6)])
    assert chosen == {1: 4, 2: 4, 4: 2, 8: 1}
    row.observe_verification(2, 100.0)  # the row's own timing of a pass is not folded in: the batch measures them
    assert row.verification_seconds()[1] == pytest.approx(8 / 8 + 2)


class Script(Drafter):
    """Drafts the continuation of known sequences (every draft accepted), each from its `start` on (a prefix of at
    least that many tokens); abstains on any other prefix."""

    kind = "script"
    returns_logits = False

    def __init__(self, *scripts: tuple[list[int], int]) -> None:
        super().__init__("script")
        self.scripts = scripts

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        n = input_ids.shape[1]
        for sequence, start in self.scripts:
            if n >= start and input_ids[0].tolist() == sequence[:n]:
                return torch.tensor([sequence[n : n + num_tokens]]), None
        return input_ids[:, :0], None


def _scripts(target, ids, mask, *starts: int | None) -> tuple[torch.Tensor, Script]:
    """Plain batched generate's 40 tokens per row, and a `Script` of row b's from its ``starts[b]``-th new token on
    (None: row b has none)."""
    plain = _plain(target, ids, mask, 40)
    rows = [ROWS[b] + plain[b, ids.shape[1] :].tolist() for b in range(len(ROWS))]
    return plain, Script(*[(rows[b], len(ROWS[b]) + s) for b, s in enumerate(starts) if s is not None])


@pytest.fixture
def always_drafting(monkeypatch):
    """The batch's `DraftingGuard` replaced by one that always drafts and plays no plain round: the tests that use
    it isolate the rows' shares of a pass from the guard (tested on its own below)."""

    class AlwaysDrafting(DraftingGuard):
        def drafting(self, first):
            return True

        def observe(self, **kwargs):
            pass

    monkeypatch.setattr(hf_metasd.batched.loop, "DraftingGuard", AlwaysDrafting)


def _charge_tokens(fake_clock, target, cost):
    """The fake clock advances `cost(T)` per target pass over T tokens in all (rows x columns)."""

    def hook(module, args, kwargs):
        fake_clock.now += cost(kwargs["input_ids"].numel())

    return target.register_forward_pre_hook(hook, with_kwargs=True)


def test_a_row_is_charged_its_share_of_each_pass(target, fake_clock, always_drafting):
    """A pass costs T units for T tokens (every token its compute). Row 0 drafts 4 tokens a round, rows 1 and 2 none:
    each pass of 3 rows x 5 columns costs 15, of which row 0 is charged 15 / 3 and a row that verified one token
    15 / 3 x V(3) / V(15) = 1, the same as in a pass where no row drafts: what its choice costs the batch."""
    ids, mask = left_pad(ROWS)
    plain, script = _scripts(target, ids, mask, 0)
    handle = _charge_tokens(fake_clock, target, float)
    try:
        out = _metasd(target, ids, mask, 40, [script], meta_policy="fixed", meta_draft_length="fixed")
    finally:
        handle.remove()
    stats = out.metasd
    assert torch.equal(out.sequences, plain)
    # the prefill (3 x 15 = 45, shared equally), 7 passes of 3 x 5 while row 0 drafts, then 32 of 2 rows x 1
    assert stats.pass_seconds == [45.0] + [15.0] * 7 + [2.0] * 32
    assert stats.pass_costs == pytest.approx({15: 15.0, 2: 2.0})
    assert [row.wall_seconds for row in stats.rows] == pytest.approx([15 + 7 * 5, 15 + 7 + 32, 15 + 7 + 32])
    assert stats.rows[0].verification_costs[5] == pytest.approx(15 / 3)  # a row's share of a pass of 3 x 5


@pytest.mark.parametrize("cost", ["flat", "per_token"])
def test_rows_draft_short_when_every_token_costs_its_compute(target, fake_clock, cost, always_drafting):
    """With passes that cost the same whatever their width the rows draft the cap; with passes whose every token
    costs its compute a draft of n costs n + 1 plain shares, which no draft repays: the rows draft one token."""
    ids, mask = left_pad(ROWS)
    plain, script = _scripts(target, ids, mask, 0)
    handle = _charge_tokens(fake_clock, target, (lambda t: 1.0) if cost == "flat" else float)
    try:
        out = _metasd(target, ids, mask, 40, [script], meta_policy="fixed")
    finally:
        handle.remove()
    assert torch.equal(out.sequences, plain)
    drafted = out.metasd.rows[0].drafted
    assert drafted[:2] == [4, 4]  # nothing measured yet: the cap
    # then the lengths the pass costs may favour are tried (as for one request), and the rows settle
    assert drafted[-5:-1] == ([4] * 4 if cost == "flat" else [1] * 4)


def test_a_row_that_starts_drafting_late_reads_what_the_batch_s_passes_measured(target, fake_clock, always_drafting):
    """Row 2 has nothing to draft before its 10th token; by then row 0's passes measured that every token costs its
    compute, and row 2's first draft is one token (a row learning only from its own passes would draft the cap)."""
    ids, mask = left_pad(ROWS)
    plain, script = _scripts(target, ids, mask, 0, None, 10)
    handle = _charge_tokens(fake_clock, target, float)
    try:
        out = _metasd(target, ids, mask, 40, [script], meta_policy="fixed")
    finally:
        handle.remove()
    assert torch.equal(out.sequences, plain)
    drafted = out.metasd.rows[2].drafted
    assert drafted[:10] == [0] * 10 and set(drafted[10:-1]) == {1}


@pytest.mark.parametrize("cost", ["flat", "per_token"])
def test_the_batch_stops_drafting_once_it_measures_slower_than_plain_rounds(target, fake_clock, cost):
    """The round after the prefill is plain (no row drafts); then the batch drafts, and where every token costs its
    compute (a pass of T tokens costs T) drafting rounds cost more per token than that plain round, so after 4 of them
    the batch runs plain rounds to the end; where a pass costs the same whatever its width, it drafts to the end.
    The output is plain's either way."""
    ids, mask = left_pad(ROWS)
    plain, script = _scripts(target, ids, mask, 0)
    handle = _charge_tokens(fake_clock, target, (lambda t: 1.0) if cost == "flat" else float)
    try:
        out = _metasd(target, ids, mask, 40, [script], meta_policy="fixed", meta_draft_length="fixed")
    finally:
        handle.remove()
    stats = out.metasd
    assert torch.equal(out.sequences, plain)
    assert stats.pass_columns[1] == 1  # the plain round
    if cost == "flat":
        assert stats.drafting_stopped_after is None and stats.plain_tokens == [1, 1, 1]
        assert set(stats.rows[0].drafted[:-1]) == {4}  # row 0 drafts 4 a round to its end
    else:
        assert stats.drafting_stopped_after == 4
        assert stats.pass_columns[2:6] == [5] * 4 and set(stats.pass_columns[6:]) == {1}
        assert stats.plain_tokens[1] == 40 - sum(stats.rows[1].new_tokens) and len(stats.rows[0].drafted) == 5


@pytest.mark.parametrize("eos", [None, [95]])
def test_a_feature_head_in_rows_that_stopping_criteria_end_early(target, eos):
    """Rows that run ahead and rows that a criterion ends at an earlier step than the tokens they hold (plain pads
    the rest): the head is handed only the features of positions the row keeps, and the output is plain's."""
    ids, mask = left_pad(ROWS)
    plain = _plain(target, ids, mask, MAX_NEW)
    tokens = [int(plain[b, ids.shape[1] + step]) for b, step in ((0, 4), (2, 6))]
    kwargs = {"eos_token_id": eos, "pad_token_id": 0}
    stopped = _plain(
        target, ids, mask, MAX_NEW, stopping_criteria=StoppingCriteriaList([StopOnTokens(tokens)]), **kwargs
    )
    pool = [FeatureHeadDrafter(trained_head(target)), _half_corpus(target, ids, mask)]
    criteria = StoppingCriteriaList([StopOnTokens(tokens)])
    out = _metasd(target, ids, mask, MAX_NEW, pool, stopping_criteria=criteria, meta_policy="ucb", **kwargs)
    assert torch.equal(out.sequences, stopped)
