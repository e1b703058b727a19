"""Batched MetaSD (`hf_metasd.batched`): `input_ids` of shape (B, L) with left padding give exactly plain batched
`generate`'s output (greedy tokens, per-row stopping and padding, stopping-criteria calls, streamed steps), one
target forward pass per round for the whole batch, sampling per row from the target's distribution; what rows cannot
draft with runs plain rounds with plain's output (scores, logits, hidden states included), said in the telemetry; only
MetaSD settings a batch cannot apply are refused, before any compute."""

from __future__ import annotations

import pytest
import torch
from conftest import StopOnToken, metasd_greedy, prompts, sharpen, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer, TextStreamer

import hf_metasd
from hf_metasd import MetaSDConfigError
from hf_metasd.batched import MetaSDBatchStats
from hf_metasd.drafters import CorpusDrafter, Drafter, ModelDrafter, PromptLookupDrafter
from hf_metasd.policies import get_policy

#: rows of different lengths (left-padded in a batch); row 1 repeats itself (prompt lookup finds matches)
ROWS = [[5, 17, 9], [3, 8, 3, 8, 3, 8, 3], [40, 2, 61, 7, 33, 12, 50, 21, 9, 44, 70]]
N = 4  # draft length


def left_pad(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids, mask)`` of `rows` left-padded with `pad` to the longest."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1
    return ids, mask


@pytest.fixture(scope="module")
def continuations(target) -> list[list[int]]:
    """Each row's own greedy continuation (40 tokens), alone: a corpus that drafts rows 0 and 2 well."""
    return [target.generate(torch.tensor([r]), do_sample=False, max_new_tokens=40)[0, len(r) :].tolist() for r in ROWS]


@pytest.fixture
def pool(continuations) -> list[Drafter]:
    corpus = CorpusDrafter.from_sequences([ROWS[0] + continuations[0], ROWS[2] + continuations[2]], name="corpus")
    return [corpus, PromptLookupDrafter(max_matching_ngram_size=2)]


def _plain(target, ids, mask, max_new_tokens, **kwargs):
    return target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)


def _metasd(target, ids, mask, max_new_tokens, pool, **kwargs):
    kwargs = {"num_assistant_tokens": N, "return_dict_in_generate": True, **kwargs}
    return metasd_greedy(target, ids, max_new_tokens, attention_mask=mask, assistant_models=pool, **kwargs)


@pytest.fixture
def forward_calls(target):
    calls = []
    handle = target.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


@pytest.fixture
def patient_guard(monkeypatch):
    """The batch's drafting guard plays its plain round but never stops drafting: on a loaded machine a wall-clock
    comparison may stop it, and the tests that use this count drafting rounds (the guard is tested in
    tests/test_batched_heads.py)."""
    import functools

    import hf_metasd.batched.loop as loop
    from hf_metasd.batched.lengths import DraftingGuard

    monkeypatch.setattr(loop, "DraftingGuard", functools.partial(DraftingGuard, min_rounds=10**9))


# ---------------------------------------------------------------------- greedy: plain batched generate's output
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_is_plain_batched_generate_through_both_entry_points(
    target, pool, entry_point, batch, forward_calls, patient_guard
):
    ids, mask = left_pad(ROWS[:batch] if batch == 3 else ROWS[1:2])
    plain = _plain(target, ids, mask, 24)
    forward_calls.clear()
    # an acceptance reward and a fixed draft length: the rounds do not depend on this machine's clock
    out = _metasd(target, ids, mask, 24, pool, meta_reward="be", meta_draft_length="fixed")
    assert torch.equal(out.sequences, plain)
    if batch > 1:
        stats = out.metasd
        assert isinstance(stats, MetaSDBatchStats) and len(stats.rows) == batch
        # one target forward per round for the whole batch, fewer than plain's 24 steps (drafts were accepted)
        assert len(forward_calls) == stats.rounds < 24
        assert max(max(row.accepted) for row in stats.rows) >= 2
        assert stats.output_tokens == [24] * batch
        # each row's own policy and rounds; the wasted slots are bounded by the draft length per pass
        assert all(sum(row.new_tokens) + plain >= 24 for row, plain in zip(stats.rows, stats.plain_tokens))
        assert sum(stats.plain_tokens) >= batch  # the guard's plain round: one token per row
        assert all(0 <= w <= N * stats.rounds for w in stats.wasted_slots)
        assert "MetaSD batch of 3" in stats.summary() and stats.to_dict()["rounds"] == stats.rounds


def test_greedy_on_random_batches(target, entry_point):
    """Ten batches of three random prompts (3 to 12 tokens), a corpus of half of their continuations: every output
    is plain batched generate's (a position or mask off by one slot changes some)."""
    for seed in range(10):
        rows = [p[0].tolist() for p in prompts(3, seed=seed)]
        ids, mask = left_pad(rows)
        plain = _plain(target, ids, mask, 20)
        half = [rows[b] + plain[b, ids.shape[1] : ids.shape[1] + 10].tolist() for b in range(3)]
        pool = [CorpusDrafter.from_sequences(half), PromptLookupDrafter(max_matching_ngram_size=2)]
        assert torch.equal(_metasd(target, ids, mask, 20, pool).sequences, plain), f"seed {seed}"


def _architectures():
    from test_architectures import ARCHITECTURES

    return sorted(ARCHITECTURES)


@pytest.mark.parametrize("family", _architectures())
def test_the_architecture_matrix_at_batch_size_two(family):
    """Every family of tests/test_architectures.py gives plain batched generate's output: the full-attention families
    (rotary, ALiBi, absolute positions, MoE) while drafting, the sliding-window, recurrent and hybrid families in plain
    rounds, said once in the telemetry."""
    from test_architectures import ARCHITECTURES, RECURRENT, build

    model = build(family)
    plain_only = family in RECURRENT or "sliding_window" in ARCHITECTURES[family][2]
    for seed in range(2):
        rows = [p[0].tolist() for p in prompts(2, seed=seed)]
        ids, mask = left_pad(rows)
        plain = _plain(model, ids, mask, 10)
        half = [rows[b] + plain[b, ids.shape[1] : ids.shape[1] + 6].tolist() for b in range(2)]
        pool = [CorpusDrafter.from_sequences(half), PromptLookupDrafter(max_matching_ngram_size=2)]
        out = _metasd(model, ids, mask, 10, pool)
        assert torch.equal(out.sequences, plain), f"seed {seed}"
        reason = out.metasd.plain_reason or ""
        assert reason.startswith("every round: the target's cache") == plain_only, reason
        if plain_only:
            assert out.metasd.plain_tokens == out.metasd.output_tokens == [10, 10]
            assert all(row.rounds == 0 for row in out.metasd.rows)


@pytest.mark.parametrize("max_new_tokens", [1, 7])
def test_max_new_tokens(target, pool, max_new_tokens):
    ids, mask = left_pad(ROWS)
    assert torch.equal(
        _metasd(target, ids, mask, max_new_tokens, pool).sequences, _plain(target, ids, mask, max_new_tokens)
    )


def test_rows_stop_at_their_own_eos_and_are_padded_as_plain_pads_them(target, pool, continuations):
    ids, mask = left_pad(ROWS)
    plain = _plain(target, ids, mask, 30)
    # an EOS list that stops rows at different steps: row 0 early, row 2 later, row 1 maybe never
    eos = [continuations[0][2], continuations[2][11]]
    kwargs = {"eos_token_id": eos, "pad_token_id": 0}
    stopped = _plain(target, ids, mask, 30, **kwargs)
    out = _metasd(target, ids, mask, 30, pool, **kwargs)
    assert torch.equal(out.sequences, stopped) and not torch.equal(stopped, plain[:, : stopped.shape[1]])
    assert out.metasd.output_tokens[0] < stopped.shape[1] - ids.shape[1]  # row 0 ended early, then padding


@pytest.mark.parametrize("eos", [None, [95]])
def test_a_stopping_criterion_is_called_as_plain_generate_calls_it(target, pool, continuations, eos):
    """Without an EOS criterion plain generate keeps decoding a finished row (no padding) until every row is finished;
    with one it pads the row, also when the row had run ahead (its drafts accepted). The criterion sees the same
    batches, once per step."""
    ids, mask = left_pad(ROWS)
    token = continuations[2][5]
    kwargs = {"eos_token_id": eos, "pad_token_id": 0}
    plain_criterion, meta_criterion = StopOnToken(token), StopOnToken(token)
    plain = _plain(target, ids, mask, 20, stopping_criteria=StoppingCriteriaList([plain_criterion]), **kwargs)
    out = _metasd(target, ids, mask, 20, pool, stopping_criteria=StoppingCriteriaList([meta_criterion]), **kwargs)
    assert torch.equal(out.sequences, plain)
    assert meta_criterion.calls == plain_criterion.calls
    steps = plain.shape[1] - ids.shape[1]
    assert out.metasd.output_tokens[2] == (6 if eos else steps) and steps > 6  # row 2 stopped first
    assert sum(out.metasd.rows[2].new_tokens) > 6  # after running ahead


def test_logits_processors_see_the_batch_as_plain_generate_gives_it(target):
    """The repetition penalty skips each row's left padding (a per-row tensor built for the batch), no-repeat n-grams
    and a minimum length read the padded row: processors run on the whole batch, each row in its place."""
    ids, mask = left_pad(ROWS)
    kwargs = {"repetition_penalty": 1.3, "no_repeat_ngram_size": 3, "min_new_tokens": 6, "pad_token_id": 0}
    plain = _plain(target, ids, mask, 16, **kwargs)
    kwargs["eos_token_id"] = [int(plain[0, ids.shape[1] + 3]), int(plain[1, ids.shape[1] + 8])]  # before the minimum
    plain = _plain(target, ids, mask, 16, **kwargs)
    corpus = [ROWS[b] + plain[b, ids.shape[1] :].tolist() for b in range(3)]
    pool = [CorpusDrafter.from_sequences(corpus), PromptLookupDrafter()]
    out = _metasd(target, ids, mask, 16, pool, **kwargs)
    assert torch.equal(out.sequences, plain)
    assert sum(sum(row.accepted) for row in out.metasd.rows) > 0


def test_stop_strings_with_a_tokenizer(target, pool, continuations):
    from test_generate_features import _tokenizer

    tokenizer = _tokenizer(target.config.vocab_size)
    ids, mask = left_pad(ROWS)
    stop = tokenizer.convert_ids_to_tokens([continuations[0][3]])[0]
    kwargs = {"stop_strings": [stop], "tokenizer": tokenizer, "pad_token_id": 0}
    plain = _plain(target, ids, mask, 16, **kwargs)
    hf_metasd.enable()
    out = target.generate(
        ids, attention_mask=mask, do_sample=False, max_new_tokens=16, assistant_models=pool, **kwargs
    )
    assert torch.equal(out, plain)


class Steps(BaseStreamer):
    """A streamer that takes a batch: records what it is given."""

    def __init__(self):
        self.puts, self.ended = [], False

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ended = True


def test_a_batch_streamer_gets_plain_generate_s_steps(target, pool, continuations):
    ids, mask = left_pad(ROWS)
    plain, meta = Steps(), Steps()
    kwargs = {"eos_token_id": [continuations[0][2]], "pad_token_id": 0}
    _plain(target, ids, mask, 10, streamer=plain, **kwargs)
    _metasd(target, ids, mask, 10, pool, streamer=meta, **kwargs)
    assert meta.puts == plain.puts and meta.ended


def test_transformers_streamers_refuse_a_batch_as_in_plain_generate(target, pool, forward_calls):
    ids, mask = left_pad(ROWS)
    with pytest.raises(ValueError, match="TextStreamer only supports batch size 1"):
        _plain(target, ids, mask, 5, streamer=TextStreamer(None))
    forward_calls.clear()
    with pytest.raises(ValueError, match="TextStreamer only supports batch size 1"):
        _metasd(target, ids, mask, 5, pool, streamer=TextStreamer(None))
    with pytest.raises(ValueError, match="TextStreamer only supports batch size 1"):
        _metasd(target, ids, mask, 5, pool, metasd_streamer=TextStreamer(None))
    assert not forward_calls


def test_rows_learn_from_their_own_rounds(target, pool):
    """Row 1 repeats itself: prompt lookup drafts it; rows 0 and 2 have the corpus. Each row's policy learns alone."""
    ids, mask = left_pad(ROWS)
    stats = _metasd(target, ids, mask, 24, pool, meta_policy="ucb").metasd
    names = stats.rows[0].drafter_names
    pulls = [row.pulls for row in stats.rows]
    assert pulls[0][names.index("corpus")] > 0 and pulls[2][names.index("corpus")] > 0
    assert len({id(row) for row in stats.rows}) == 3


def test_learned_priors_are_kept_per_target_and_batch_size(target, pool):
    """A batched call's rows start from what earlier calls at the same batch size learnt; calls of one request (or of
    another batch size) keep theirs apart: a pass over three rows costs what it costs at three."""
    ids, mask = left_pad(ROWS)
    first = _metasd(target, ids, mask, 12, pool).metasd
    assert all(row.learned_priors == {} for row in first.rows)
    second = _metasd(target, ids, mask, 12, pool).metasd
    assert all(set(row.learned_priors) == {"corpus", "prompt_lookup", "no_draft"} for row in second.rows)
    assert _metasd(target, ids[:1], mask[:1], 12, pool).metasd.learned_priors == {}
    assert all(row.learned_priors == {} for row in _metasd(target, ids[:2], mask[:2], 12, pool).metasd.rows)


def test_a_target_config_is_what_plain_uses(pool):
    """A target with several EOS ids in its generation config: the same padding as plain."""
    torch.manual_seed(3)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4)
    ).eval()
    ids, mask = left_pad(ROWS)
    reference = _plain(model, ids, mask, 12, pad_token_id=0)
    model.generation_config.eos_token_id = [int(reference[0, -9]), int(reference[2, -5])]
    model.generation_config.pad_token_id = 0
    plain = _plain(model, ids, mask, 12)
    assert torch.equal(_metasd(model, ids, mask, 12, pool).sequences, plain)


# ---------------------------------------------------------------------- sampling
class SampledDrafter(Drafter):
    """A model-free drafter that samples from a fixed distribution and returns its logits: the speculative-sampling
    path of verification (the built-in model-free drafters are deterministic)."""

    kind = "sampled"
    replayable = True

    def __init__(self, logits: torch.Tensor):
        super().__init__("sampled")
        self.logits = logits

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        logits = self.logits.expand(1, num_tokens, -1)
        return torch.multinomial(logits[0].softmax(-1), 1).T, logits


@pytest.mark.parametrize("drafter", ["prompt_lookup", "sampled", "model"])
def test_sampling_follows_the_target_distribution_per_row(drafter):
    """Many rows of two prompts in one batch: each row's first two sampled tokens follow the target's joint (a model
    drafter samples each row's draft from its own copy's distribution, then speculative sampling per row)."""
    scipy_stats = pytest.importorskip("scipy.stats")
    vocab = 6
    target = tiny_llama(10, vocab=vocab)
    with torch.no_grad():
        target.lm_head.weight.mul_(3.0)
    if drafter == "sampled":
        pool = SampledDrafter(torch.tensor([0.0, 2.0, 0.0, 1.0, 1.0, 0.0]))
    elif drafter == "model":
        pool = ModelDrafter(sharpen(tiny_llama(11, layers=1, vocab=vocab), 10.0))
    else:
        pool = PromptLookupDrafter(max_matching_ngram_size=1)
    texts = [[1, 4, 1, 4, 1], [2, 3]]
    rows = [texts[i % 2] for i in range(200)]
    ids, mask = left_pad(rows)
    counts = torch.zeros(2, vocab, vocab)
    torch.manual_seed(0)
    for _ in range(4):
        out = target.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            max_new_tokens=2,
            custom_generate=hf_metasd.generate,
            assistant_models=[pool],
            num_assistant_tokens=2,
            meta_policy="fixed",  # always the drafter (after the first call's calibration round)
        )
        for i in range(len(rows)):
            counts[i % 2, out[i, -2], out[i, -1]] += 1
    for p, prompt in enumerate(texts):
        with torch.no_grad():
            first = target(torch.tensor([prompt])).logits[0, -1].softmax(-1)
            second = torch.stack(
                [target(torch.tensor([prompt + [x]])).logits[0, -1].softmax(-1) for x in range(vocab)]
            )
        expected = (first[:, None] * second).flatten().double()
        observed = counts[p].flatten().double()
        keep = expected * observed.sum() >= 5
        obs = torch.cat([observed[keep], observed[~keep].sum()[None]])
        exp = torch.cat([expected[keep], expected[~keep].sum()[None]]) * observed.sum()
        obs, exp = obs[exp > 0], exp[exp > 0]
        assert scipy_stats.chisquare(obs.numpy(), (exp * obs.sum() / exp.sum()).numpy()).pvalue > 1e-3


# ---------------------------------------------------------------------- refusals (MetaSD settings), before any compute
def _refused(forward_calls, match, fn):
    forward_calls.clear()
    with pytest.raises(MetaSDConfigError, match=match):
        fn()
    assert not forward_calls, "the error must be raised before any forward pass"


def test_a_policy_object_is_refused_at_batch_size_above_one(target, pool, forward_calls):
    ids, mask = left_pad(ROWS)
    _refused(
        forward_calls,
        r"`meta_policy` must be a policy name at batch size > 1 \(every row learns with a policy of its own\), but is "
        r"a `UCB` object\. Pass its name",
        lambda: _metasd(target, ids, mask, 5, pool, meta_policy=get_policy("ucb")),
    )


def test_the_transposed_kernel_is_refused_at_batch_size_above_one(target, pool, forward_calls):
    ids, mask = left_pad(ROWS)
    _refused(
        forward_calls,
        r"`meta_skinny_gemm` must be None or False at batch size > 1 .*, but is True\. Drop it\.",
        lambda: _metasd(target, ids, mask, 5, pool, meta_skinny_gemm=True),
    )


# ---------------------------------------------------------------------- what rows cannot draft with: plain rounds
#: the output field each per-step output fills
_OUTPUT_FIELDS = {
    "output_scores": "scores",
    "output_logits": "logits",
    "output_hidden_states": "hidden_states",
    "output_attentions": "attentions",
}


#: rounds that do not depend on this machine's clock: always the drafter, an acceptance reward, a fixed draft length
_DETERMINISTIC = {"meta_policy": "fixed", "meta_reward": "be", "meta_draft_length": "fixed"}


def _same(a, b) -> bool:
    """Exactly equal: tensors bit for bit (float32), tuples element by element, None and None."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return a is None and b is None


def _plain_rounds(out, reason: str) -> None:
    """`out`'s batch ran every round plain, for `reason`, said once in its telemetry."""
    stats = out.metasd
    assert stats.plain_reason.startswith(f"every round: {reason}"), stats.plain_reason
    assert stats.plain_tokens == stats.output_tokens and stats.rounds == 0
    assert all(row.rounds == 0 for row in stats.rows) and "plain rounds: every round" in stats.summary()


@pytest.mark.parametrize("output", list(_OUTPUT_FIELDS))
def test_per_step_outputs_are_plain_generate_s_at_batch_size_above_one(
    target, pool, continuations, entry_point, output
):
    """Plain computes them in one-token steps (a verification pass's differ in the last bits) and for finished rows too
    (row 0 stops at its EOS, then its padding is fed): plain rounds give them bit for bit, through both entry points."""
    ids, mask = left_pad(ROWS)
    kwargs = {output: True, "return_dict_in_generate": True, "eos_token_id": [continuations[0][2]], "pad_token_id": 0}
    plain = _plain(target, ids, mask, 8, **kwargs)
    out = _metasd(target, ids, mask, 8, pool, **kwargs)
    assert torch.equal(out.sequences, plain.sequences)
    name = _OUTPUT_FIELDS[output]
    assert getattr(plain, name) is not None and _same(getattr(out, name), getattr(plain, name))
    assert len(getattr(out, name)) == plain.sequences.shape[1] - ids.shape[1] == 8
    _plain_rounds(out, f"`{output}` is True (plain computes them in one-token steps, for finished rows too)")
    assert out.metasd.output_tokens == [3, 8, 8]  # row 0's EOS is its third token


def test_scores_with_sampling_are_plain_generate_s(target, pool):
    """Plain rounds draw as plain does: with one seed, the same samples and scores as plain batched generate."""
    ids, mask = left_pad(ROWS)
    kwargs = {"do_sample": True, "max_new_tokens": 8, "output_scores": True, "return_dict_in_generate": True}
    torch.manual_seed(7)
    plain = target.generate(ids, attention_mask=mask, **kwargs)
    torch.manual_seed(7)
    out = target.generate(
        ids, attention_mask=mask, custom_generate=hf_metasd.generate, assistant_models=pool, **kwargs
    )
    assert torch.equal(out.sequences, plain.sequences) and _same(out.scores, plain.scores)


def test_a_sliding_window_target_runs_plain_rounds(pool, entry_point):
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=4,
    )
    model = MistralForCausalLM(config).eval()
    ids, mask = left_pad(ROWS)
    plain = _plain(model, ids, mask, 12, pad_token_id=0)
    out = _metasd(model, ids, mask, 12, pool, pad_token_id=0)
    assert torch.equal(out.sequences, plain)
    _plain_rounds(
        out, "the target's cache holds `DynamicSlidingWindowLayer` layers (a row's rejected slots are masked"
    )


def test_a_filled_cache_runs_plain_rounds(target, pool):
    """A cache passed in that holds positions: plain generate continues it, and so does the batch (plain rounds),
    returning the cache as plain does."""
    from transformers import DynamicCache

    ids, mask = left_pad(ROWS)
    caches = [DynamicCache(config=target.config) for _ in range(2)]
    with torch.no_grad():
        for cache in caches:
            target(ids[:, :2], attention_mask=mask[:, :2], cache=cache)
    plain = _plain(target, ids, mask, 6, cache=caches[0], return_dict_in_generate=True)
    out = _metasd(target, ids, mask, 6, pool, cache=caches[1])
    assert torch.equal(out.sequences, plain.sequences)
    assert out.cache is caches[1] and out.cache.get_seq_length() == plain.cache.get_seq_length()
    _plain_rounds(out, "the cache passed in holds 2 positions")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("empty", [0, 1])
def test_a_row_whose_mask_keeps_no_token_gets_plain_generate_s_tokens(entry_point, attention, empty, patient_guard):
    """Plain gives such a row tokens (its first from attention over no token, which each attention implementation
    computes its own way): the prefill round is plain's prefill pass, then every row drafts, that row too."""
    model = sharpen(tiny_llama(0))
    model.set_attn_implementation(attention)
    ids, mask = left_pad(ROWS)
    mask[empty] = 0
    plain = _plain(model, ids, mask, 16)
    width = ids.shape[1]
    corpus = [plain[b, width:].tolist() for b in range(3)] + [ROWS[b] + plain[b, width:].tolist() for b in range(3)]
    out = _metasd(model, ids, mask, 16, [CorpusDrafter.from_sequences(corpus)], **_DETERMINISTIC)
    assert torch.equal(out.sequences, plain)
    stats = out.metasd
    assert stats.plain_reason.startswith(f"the prefill round: row {empty}'s `attention_mask` keeps no token")
    assert all(sum(row.accepted) > 0 for row in stats.rows)  # every row drafted, the empty one too
    assert stats.plain_tokens == [2, 2, 2]  # the prefill round and the guard's plain round


def test_token_type_ids_are_fed_like_the_mask_while_rows_draft(entry_point):
    """gpt2 embeds token types: every later token takes its row's last type (as plain extends them) on every column a
    pass feeds, drafted ones included."""
    from test_architectures import build

    model = build("gpt2")
    ids, mask = left_pad(ROWS)
    types = (torch.arange(ids.shape[1]) % 3 == 0).long().repeat(3, 1)
    types[1] = 1 - types[1]  # rows end on different types
    plain = _plain(model, ids, mask, 16, token_type_ids=types)
    assert not torch.equal(plain, _plain(model, ids, mask, 16))  # the types change the output
    width = ids.shape[1]
    corpus = [ROWS[b] + plain[b, width:].tolist() for b in range(3)]
    out = _metasd(model, ids, mask, 16, [CorpusDrafter.from_sequences(corpus)], token_type_ids=types, **_DETERMINISTIC)
    assert torch.equal(out.sequences, plain)
    assert out.metasd.plain_reason is None and all(sum(row.accepted) > 0 for row in out.metasd.rows)


def test_other_model_inputs_run_plain_rounds(target, pool):
    ids, mask = left_pad(ROWS)
    embeds = target.get_input_embeddings()(ids).detach()
    plain = _plain(target, ids, mask, 6, inputs_embeds=embeds)
    out = _metasd(target, ids, mask, 6, pool, inputs_embeds=embeds)
    assert torch.equal(out.sequences, plain)
    _plain_rounds(out, "`inputs_embeds` is a model input (rows draft with `input_ids`, `attention_mask` and")


@pytest.mark.parametrize(("batch", "with_mask"), [(1, True), (1, False), (2, True)])
def test_a_prompt_given_as_inputs_embeds_alone_gives_plain_output(target, entry_point, batch, with_mask):
    """`inputs_embeds` without `input_ids`: the drafters never see the prompt, so the first round is the target's
    alone (its pass reads the embeddings); one request then drafts from the new tokens, a batch runs plain rounds.
    The output is plain's: the new tokens."""
    ids, mask = left_pad(ROWS[1 : 1 + batch])
    embeds = target.get_input_embeddings()(ids).detach()
    kwargs = {"inputs_embeds": embeds, "attention_mask": mask} if with_mask else {"inputs_embeds": embeds}
    plain = target.generate(do_sample=False, max_new_tokens=12, **kwargs)
    pool = [ModelDrafter(sharpen(tiny_llama(1, layers=1)), name="small"), PromptLookupDrafter()]
    out = metasd_greedy(
        target, None, 12, assistant_models=pool, meta_policy="round_robin", return_dict_in_generate=True, **kwargs
    )
    assert torch.equal(out.sequences, plain) and out.sequences.shape == (batch, 12)
    if batch == 1:
        assert out.metasd.drafted[0] == 0 and sum(out.metasd.drafted) > 0  # the first round plain, then drafts
    else:
        _plain_rounds(out, "`inputs_embeds` is a model input")


@pytest.mark.parametrize("batch", [1, 2])
def test_int32_input_ids_come_back_as_plain_returns_them(target, pool, entry_point, batch):
    ids, mask = left_pad(ROWS[:batch])
    ids, mask = ids.int(), mask.int()
    plain = _plain(target, ids, mask, 6)
    out = _metasd(target, ids, mask, 6, pool)
    assert out.sequences.dtype == plain.dtype == torch.int64 and torch.equal(out.sequences, plain)


def test_a_tensor_parallel_target_runs_plain_rounds(target, pool, monkeypatch):
    """Its ranks would have to agree on every row's drafts: plain rounds (the tiny target stands for a sharded one)."""
    import hf_metasd.batched.plain as plain_module

    ids, mask = left_pad(ROWS)
    plain = _plain(target, ids, mask, 6)
    monkeypatch.setattr(plain_module, "tensor_parallel_group", lambda model: object())
    out = _metasd(target, ids, mask, 6, pool)
    assert torch.equal(out.sequences, plain)
    _plain_rounds(out, "the target is tensor-parallel")


def test_plain_reason_names_what_generate_never_prepares_for_a_text_model(target):
    """Several position streams, no cache, a cache of no layers: `plain_reason` (called directly; the tiny models
    here have none of them)."""
    from types import SimpleNamespace

    from transformers import DynamicCache

    from hf_metasd.batched import plain_reason

    ids, mask = left_pad(ROWS)
    kwargs = {"attention_mask": mask, "position_ids": mask.cumsum(-1), "cache": DynamicCache(config=target.config)}
    config = target.generation_config
    assert plain_reason(target, config, kwargs) is None  # as generate prepares them: rows draft
    assert plain_reason(target, config, {**kwargs, "cache": None}) == "`generate` prepared no cache"
    positions = kwargs["position_ids"][None]
    assert plain_reason(target, config, {**kwargs, "position_ids": positions}).startswith("the target takes 3-D")
    reason = plain_reason(target, config, {**kwargs, "cache": SimpleNamespace()})
    assert reason == "the target's cache is a `SimpleNamespace` without layers"
    assert plain_reason(target, config, {**kwargs, "token_type_ids": mask[None]}).startswith("`token_type_ids` is 3-D")


# ---------------------------------------------------------------------- the benchmark hook
def test_the_batch_benchmark_times_both_methods_on_the_same_batches(target, pool, tmp_path):
    from hf_metasd.benchmark.batch import run_batch_bench, write_batch_report
    from hf_metasd.benchmark.prompts import BenchPrompt

    texts = [*ROWS, ROWS[0][::-1], ROWS[1][:4]]
    prompts = [BenchPrompt("qa", f"qa/{i}", str(i)) for i in range(len(texts))]
    records = run_batch_bench(
        target,
        None,
        prompts,
        pool,
        batch_size=3,
        max_new_tokens=6,
        encode=lambda tokenizer, text: torch.tensor([texts[int(text)]]),
        warm_up_tokens=2,
    )
    assert [r.prompt_ids for r in records] == [["qa/0", "qa/1", "qa/2"], ["qa/3", "qa/4"]]
    assert all(r.identical for r in records) and [r.new_tokens for r in records] == [18, 12]
    assert all(r.plain_seconds > 0 and r.metasd_seconds > 0 and r.rounds >= 1 for r in records)
    assert len(records[0].arms) == 3 and len(records[0].wasted_slots) == 3
    assert all(r.verified_rows >= r.new_tokens and r.mean_draft >= 0 for r in records)
    assert all(r.drafting_stopped_after is None or r.drafting_stopped_after >= 4 for r in records)  # the guard's
    line = write_batch_report(records, tmp_path, {"batch_size": 3})
    assert line.startswith("batch size 3: plain batched generate") and "0 batches differ from plain" in line
    assert line.endswith("0 rows at a near-tie, 0 rows in error")
    assert (tmp_path / "batch_results.json").is_file()


def test_the_cli_passes_the_batch_size(monkeypatch):
    import hf_metasd.benchmark.run as run
    from hf_metasd.cli import main

    original, seen = run.run_benchmark, {}
    monkeypatch.setattr(run, "run_benchmark", lambda **kwargs: seen.update(kwargs) or 0)
    assert main(["bench", "--batch-size", "4", "--quick"]) == 0 and seen["batch_size"] == 4
    with pytest.raises(ValueError, match=r"`batch_size` must be an int >= 1, but is 0\. Use e\.g\. 4\."):
        original(batch_size=0)  # refused before any model loads


def test_the_batch_results_name_the_machine_and_the_commit(monkeypatch, tmp_path):
    import json

    import hf_metasd.benchmark.batch as batch
    import hf_metasd.benchmark.run as run

    monkeypatch.setattr(batch, "run_batch_bench", lambda *args, **kwargs: [])
    monkeypatch.setattr(batch, "write_batch_report", lambda records, out, meta: json.dumps(meta))
    lines = []
    assert run._run_batches(None, None, [], None, 4, 8, tmp_path, lines.append, "float32") == 0
    meta = json.loads(lines[-1])
    assert meta["batch_size"] == 4 and meta["dtype"] == "float32"
    assert {"commit", "processor", "torch", "transformers"} <= set(meta["machine"])


def test_plain_steps_refuse_a_row_that_needs_no_tokens_and_see_when_no_row_can_go_on():
    from transformers import StoppingCriteria

    from hf_metasd.batched.steps import PlainSteps

    class Never(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    steps = PlainSteps(torch.tensor([[1], [2]]), 2, StoppingCriteriaList([Never()]))
    assert steps.add(0, [3, 4, 5]) == 2 and not steps.needs_tokens(0)  # capped at max_new_tokens
    with pytest.raises(RuntimeError, match=r"row 0 needs no more tokens, but was given 1\."):
        steps.add(0, [6])
    assert not steps.stuck()
    steps.add(1, [7, 8])
    assert steps.steps == 2 and steps.stuck()  # every row is full, and the criteria never fired


def _padded_to(padded):
    return lambda n: torch.cat([padded, torch.zeros(2, max(0, n - padded.shape[1]), dtype=torch.long)], 1)[:, :n]


def test_a_row_s_processors_take_one_row():
    from transformers import LogitsProcessorList, MinLengthLogitsProcessor

    from hf_metasd.batched.processors import BatchScores, RowProcessors

    padded = torch.tensor([[0, 5, 6], [7, 8, 9]])
    scores = BatchScores(LogitsProcessorList([MinLengthLogitsProcessor(5, eos_token_id=2)]), _padded_to(padded))
    row = RowProcessors(scores, 0, padded[0], prompt_length=2)  # row 0 is [5, 6] with one pad before it
    out = row(torch.tensor([[5, 6, 4]]), torch.zeros(1, 4))  # seen as [0, 5, 6, 4]: length 4 < 5, EOS forbidden
    assert torch.isinf(out[0, 2]) and len(row) == 1
    assert not torch.isinf(row(torch.tensor([[5, 6, 4, 4]]), torch.zeros(1, 4))[0, 2])  # length 5
    with pytest.raises(ValueError, match=r"a row's processors take one row, but got 2\."):
        row(padded, torch.zeros(2, 4))
