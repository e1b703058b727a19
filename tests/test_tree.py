"""The token tree's pieces (`hf_metasd.tree`) on hand-made trees and a tiny Llama: merging drafts, the mask and the
positions, the pass's logits against each node's own sequence, the cache after the kept path, greedy and sampled
acceptance, and the width policy's choice on hand-computed values."""

from __future__ import annotations

import pytest
import torch
from conftest import VOCAB, sharpen, tiny_llama
from test_sampling import _chi_square_p
from transformers import DynamicCache

from hf_metasd.decoding import accept_draft
from hf_metasd.tree import (
    TokenTree,
    accept_greedy,
    accept_sampled,
    ancestor_matrix,
    choose_tree,
    expected_tokens,
    extrapolate,
    keep_rows,
    optimistic_rates,
    tree_attention_mask,
    tree_pass,
    tree_position_ids,
    verify_tree,
)


def _tree() -> TokenTree:
    """Root 9; arm 0 drafts 1 2 3, arm 2 drafts 1 5, arm 1 drafts 4."""
    drafts = [(0, torch.tensor([1, 2, 3]), None), (2, torch.tensor([1, 5]), None), (1, torch.tensor([4]), None)]
    return TokenTree.from_drafts(9, drafts)


# ---------------------------------------------------------------------------------------------------------------------
# the tree
# ---------------------------------------------------------------------------------------------------------------------
def test_drafts_that_begin_alike_share_their_nodes():
    tree = _tree()
    assert tree.tokens.tolist() == [9, 1, 2, 3, 5, 4]
    assert tree.parents == [-1, 0, 1, 2, 1, 0] and tree.depths == [0, 1, 2, 3, 2, 1]
    assert tree.children == [[1, 5], [2, 4], [3], [], [], []]
    assert tree.branches == {0: [1, 2, 3], 2: [1, 4], 1: [5]} and tree.arms == [0, 2, 1]
    assert (tree.width, tree.num_drafted, tree.is_chain) == (6, 5, False)
    assert tree.ancestors(4) == [0, 1, 4]
    # the proposals made at a node: every arm whose draft runs through it and goes on, in arm order
    assert tree.proposals(0) == [(0, 1), (2, 1), (1, 5)]
    assert tree.proposals(1) == [(0, 2), (2, 4)]
    assert tree.proposals(4) == [] and tree.proposals(5) == []
    assert [tree.accepted_by(arm, [1, 4]) for arm in (0, 1, 2)] == [1, 0, 2]
    assert tree.path_arm([1, 4]) == 2 and tree.path_arm([1], prefer=2) == 2 and tree.path_arm([1]) == 0
    assert tree.path_arm([]) is None


def test_a_chain_is_a_tree_of_one_path():
    tree = TokenTree.from_drafts(7, [(3, torch.tensor([4, 5]), None), (1, torch.tensor([4]), None)])
    assert tree.is_chain and tree.chain() == [1, 2] and tree.branches == {3: [1, 2], 1: [1]}
    assert TokenTree.from_drafts(7, [(0, torch.tensor([], dtype=torch.long), None)]).width == 1
    with pytest.raises(ValueError, match=r"`chain` needs a tree that is one path, but this one branches"):
        _tree().chain()


def test_an_arm_with_two_drafts_is_refused():
    with pytest.raises(ValueError, match=r"`drafts` must hold one draft per arm, but arm 0 has two\. Merge them"):
        TokenTree.from_drafts(1, [(0, torch.tensor([2]), None), (0, torch.tensor([3]), None)])


def test_each_node_sees_the_cache_and_its_ancestors_only():
    tree = _tree()
    expected = [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 0, 0, 0, 0, 1],
    ]
    assert ancestor_matrix(tree).int().tolist() == expected
    mask = tree_attention_mask(tree, cached=3, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 9)
    assert (mask[0, 0, :, :3] == 0).all()
    assert ((mask[0, 0, :, 3:] == 0).int() == torch.tensor(expected)).all()
    assert (mask[0, 0][mask[0, 0] != 0] == torch.finfo(torch.float32).min).all()
    assert tree_position_ids(tree, cached=3).tolist() == [[3, 4, 5, 6, 5, 4]]
    chain = TokenTree.from_drafts(7, [(0, torch.tensor([4, 5]), None)])
    assert ancestor_matrix(chain).tolist() == torch.ones(3, 3, dtype=torch.bool).tril().tolist()


# ---------------------------------------------------------------------------------------------------------------------
# the pass and the cache, against plain forward passes
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return sharpen(tiny_llama(0))


def _prefilled(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(ids[:, :-1], cache=cache, use_cache=True)
    return cache


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_every_nodes_logits_are_those_of_its_own_sequence(model, attention):
    model.set_attn_implementation(attention)
    try:
        ids = torch.tensor([[5, 17, 42, 8, 9]])
        tree = _tree()
        cache = _prefilled(model, ids)
        with torch.no_grad():
            outputs, _ = tree_pass(model, tree, cache, cached=4)
            for node in range(tree.width):
                own = torch.cat((ids, tree.tokens[tree.ancestors(node)[1:]][None]), dim=1)
                plain = model(own).logits[0, -1]
                torch.testing.assert_close(outputs.logits[0, node], plain, atol=1e-5, rtol=0)
        assert cache.get_seq_length() == 4 + tree.width
    finally:
        model.set_attn_implementation("sdpa")


def test_the_kept_path_leaves_the_cache_of_the_kept_sequence(model):
    ids = torch.tensor([[5, 17, 42, 8, 9]])
    tree = _tree()
    cache = _prefilled(model, ids)
    with torch.no_grad():
        tree_pass(model, tree, cache, cached=4)
        keep_rows(cache, cached=4, rows=[0, 1, 4])  # the root, then 1 and 5 of arm 2's branch
        assert cache.get_seq_length() == 7
        kept = torch.cat((ids, torch.tensor([[1, 5, 11]])), dim=1)
        step = model(kept[:, -1:], cache=cache, position_ids=torch.tensor([[7]])).logits[0, -1]
        torch.testing.assert_close(step, model(kept).logits[0, -1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------------------------------
# acceptance
# ---------------------------------------------------------------------------------------------------------------------
def test_greedy_walks_the_targets_argmax_chain():
    tree = _tree()
    scores = torch.zeros(tree.width, 12)
    scores[0, 1] = scores[1, 5] = scores[4, 11] = 1.0  # after the root 1, after 1 a 5, after 1 5 an 11
    assert accept_greedy(tree, scores) == ([1, 4], [1, 5, 11])
    scores[0] = 0.0
    scores[0, 4] = 1.0  # after the root 4: arm 1's node, whose row says 0
    assert accept_greedy(tree, scores) == ([5], [4, 0])
    scores[0] = 0.0
    scores[0, 7] = 1.0  # no child holds 7: the target's own token only
    assert accept_greedy(tree, scores) == ([], [7])


def test_greedy_on_a_chain_is_token_matching():
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        draft = torch.randint(0, 4, (3,), generator=generator)
        scores = torch.randn(4, 4, generator=generator)
        tree = TokenTree.from_drafts(0, [(0, draft, None)])
        path, tokens = accept_greedy(tree, scores)
        chain_tokens, matches = accept_draft(draft[None], None, scores[None], do_sample=False)
        assert tokens == chain_tokens[0].tolist() and len(path) == matches


def _sampled_tree(p_rows: dict, q: dict, generator: torch.Generator) -> TokenTree:
    """Arms 0 and 1 sample two tokens from their `q`, arm 2 proposes 0 then 1 (deterministic)."""
    drafts = []
    for arm in (0, 1):
        first = int(torch.multinomial(q[arm][0], 1, generator=generator))
        second = int(torch.multinomial(q[arm][1 + first], 1, generator=generator))
        logits = torch.stack([q[arm][0].log(), q[arm][1 + first].log()])
        drafts.append((arm, torch.tensor([first, second]), logits))
    drafts.append((2, torch.tensor([0, 1]), None))
    return TokenTree.from_drafts(5, drafts)


def test_multi_draft_sampling_keeps_the_targets_distribution():
    """Two drafters with logits and a deterministic one, two tokens deep: the two kept tokens follow the target's
    joint distribution (Pearson chi-square over the V x V cells); the drafters' own draws do not."""
    vocab, samples = 4, 6000
    generator = torch.Generator().manual_seed(0)
    # the target: p(x1) and p(x2 | x1); each drafter: q(x1) and q(x2 | x1); index 0 the first, 1 + x1 the second
    p = torch.randn(1 + vocab, vocab, generator=generator).mul(1.5).softmax(-1)
    q = {arm: torch.randn(1 + vocab, vocab, generator=generator).mul(1.5).softmax(-1) for arm in (0, 1)}
    torch.manual_seed(1)
    counts, drafted = torch.zeros(vocab, vocab), torch.zeros(vocab, vocab)
    for _ in range(samples):
        tree = _sampled_tree(p, q, generator)
        scores = torch.stack([p[0] if d == 0 else p[1 + int(tree.tokens[n])] for n, d in enumerate(tree.depths)])
        scores[[n for n, d in enumerate(tree.depths) if d == 2]] = 1.0  # depth-2 rows (a third token): unused
        path, tokens = accept_sampled(tree, scores.log())
        if len(tokens) < 2:  # nothing accepted: the second token from the target after the first
            tokens.append(int(torch.multinomial(p[1 + tokens[0]], 1)))
        counts[tokens[0], tokens[1]] += 1
        first = tree.tokens[tree.branches[0]].tolist()
        drafted[first[0], first[1]] += 1
    joint = p[0][:, None] * p[1:]
    assert _chi_square_p(counts, joint) > 1e-3
    assert _chi_square_p(drafted, joint) < 1e-6


# ---------------------------------------------------------------------------------------------------------------------
# a hand-driven loop: trees of drafts that are partly right, verified and kept round after round
# ---------------------------------------------------------------------------------------------------------------------
def test_a_loop_of_tree_rounds_is_plain_greedy_generate(model):
    prompt = torch.tensor([[5, 17, 42, 8, 5, 17]])
    new = 30
    plain = model.generate(prompt, do_sample=False, max_new_tokens=new)
    ids = prompt
    cache = _prefilled(model, ids)
    generator = torch.Generator().manual_seed(0)
    rounds = accepted = 0
    while ids.shape[1] < plain.shape[1]:
        truth = plain[0, ids.shape[1] : ids.shape[1] + 3]
        wrong = int(torch.randint(0, len(truth) + 1, (1,), generator=generator))
        right = truth.clone()
        if wrong < len(right):
            right[wrong] = (right[wrong] + 1) % VOCAB  # right up to `wrong`, then wrong
        drafts = [
            (0, torch.randint(1, VOCAB, (3,), generator=generator), None),
            (1, right, None),
            (2, torch.cat((truth[:1], torch.randint(1, VOCAB, (2,), generator=generator))), None),
        ]
        tree = TokenTree.from_drafts(int(ids[0, -1]), drafts)
        with torch.no_grad():
            verdict = verify_tree(model, tree, ids, cache)
        kept = min(len(verdict.tokens), plain.shape[1] - ids.shape[1])
        verdict.keep(kept)
        ids = torch.cat((ids, verdict.token_tensor()[:, :kept]), dim=1)
        assert cache.get_seq_length() == ids.shape[1] - 1
        rounds, accepted = rounds + 1, accepted + verdict.num_accepted
    assert torch.equal(ids, plain)
    assert accepted > rounds  # the trees were worth more than one token a round


# ---------------------------------------------------------------------------------------------------------------------
# the width policy, on hand-computed values
# ---------------------------------------------------------------------------------------------------------------------
def test_expected_tokens_of_independent_chains():
    assert expected_tokens([]) == 1.0
    assert expected_tokens([[1.0, 1.0, 1.0]]) == 4.0
    # k = 1: 1 - (1 - 0.5)(1 - 0.8) = 0.9; k = 2: 1 - (1 - 0.25)(1 - 0) = 0.25 (arm 2 drafted one token)
    assert expected_tokens([[0.5, 0.5], [0.8]]) == pytest.approx(1 + 0.9 + 0.25)


def test_the_plan_adds_arms_while_they_raise_tokens_per_second():
    rates = {0: [0.5, 0.5], 1: [0.9, 0.9], 2: [0.1, 0.1]}
    flat = [1.0] * 7
    # free width: every arm that adds anything joins, the best first; 3 arms at most 2 tokens: width 7
    assert choose_tree((0, 2), rates, {}, flat, cap=2) == [(0, 2), (1, 2), (2, 2)]
    assert choose_tree((0, 2), rates, {}, flat, cap=2, max_arms=2) == [(0, 2), (1, 2)]
    # a plan wider than the known costs is not considered
    assert choose_tree((0, 2), rates, {}, flat[:4], cap=2) == [(0, 2), (1, 1)]
    # drafting cost: arm 1 at 1.0 s a token is not worth its tokens
    assert choose_tree((0, 2), rates, {1: 1.0}, flat, cap=2) == [(0, 2), (2, 2)]
    # unknown costs: the policy's arm alone
    assert choose_tree((0, 2), rates, {}, [None] * 7, cap=2) == [(0, 2)]
    # dear width (a pass costs its tokens): the chain, whatever the other arms promise
    linear = [float(k) for k in range(1, 8)]
    assert choose_tree((0, 2), {0: [0.5, 0.5], 1: [0.9, 0.9]}, {}, linear, cap=2) == [(0, 2)]


def test_arms_seen_little_look_better_and_unmeasured_widths_follow_the_measured_slope():
    assert optimistic_rates([0.5, 0.9], [0.0, 3.0], 0.5) == [1.0, 1.0]
    assert optimistic_rates([0.5, 0.5], [24.0, 8.0], 0.5) == pytest.approx([0.6, 0.5 + 0.5 / 3])
    assert optimistic_rates([0.5], [10.0], 0.0) == [0.5]
    assert extrapolate([1.0, 1.5, 2.0, 2.0, 2.0], {1: 1.0, 3: 2.0}) == [1.0, 1.5, 2.0, 2.5, 3.0]
    assert extrapolate([1.0, 1.0, 1.0], {2: 1.0, 3: 1.5}) == [1.0, 1.0, 1.0]  # within the measured widths: as read
    assert extrapolate([2.0, 2.0, 2.0, 2.0], {2: 1.0, 3: 1.5}) == [2.0, 2.0, 2.0, 2.0]
    assert extrapolate([1.0, 1.0, 1.0, 1.0, 1.0], {2: 1.0, 3: 1.5}) == [1.0, 1.0, 1.0, 2.0, 2.5]
    assert extrapolate([1.0, None], {}) == [None, None]  # nothing measured: no width is priced
    assert extrapolate([1.0, 1.0], {1: 1.0}) == [1.0, None]  # one width: no line to draw
