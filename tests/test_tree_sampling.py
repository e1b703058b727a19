"""Sampling with token trees keeps the target's distribution: the kept tokens of rounds whose trees hold two or four
drafters, deterministic ones among them, against the target's exact distribution (Pearson chi-square, as
`tests/test_sampling.py`; `tests/test_tree.py` checks the acceptance rule itself, with a negative control)."""

from __future__ import annotations

import pytest
import torch
from conftest import sharpen, tiny_llama
from test_sampling import _chi_square_p

import hf_metasd
from hf_metasd.drafters import Drafter

#: every verification pass costs one unit of the fake clock, whatever its width: the width policy builds trees
FLAT = 1.0


def tree_rounds(stats) -> int:
    return sum(len(arms) > 1 for arms in stats.tree_arms)


class Constant(Drafter):
    """A deterministic drafter (no logits) that proposes `token` again and again."""

    kind = "constant"
    returns_logits = False

    def __init__(self, token: int, name: str | None = None):
        super().__init__(name=name or f"constant{token}")
        self.token = token

    def draft(self, input_ids, num_tokens, *, logits_processor=None, do_sample=False):
        return torch.full((1, num_tokens), self.token), None


SAMPLE_VOCAB, SAMPLES = 6, 1500
SAMPLE_PROMPT = torch.tensor([[1, 4, 2]])


def _exact_pair(target) -> torch.Tensor:
    """p(x3, x4 | prompt): the third and fourth new tokens, the first two summed out, shape (V, V)."""
    v = SAMPLE_VOCAB

    def next_probs(ids: list[int]) -> torch.Tensor:
        return (
            target(torch.cat([SAMPLE_PROMPT, torch.tensor([ids], dtype=torch.long)], dim=1)).logits[0, -1].softmax(-1)
        )

    with torch.no_grad():
        pair = torch.zeros(v, v)
        p1 = target(SAMPLE_PROMPT).logits[0, -1].softmax(-1)
        for x1 in range(v):
            p2 = next_probs([x1])
            for x2 in range(v):
                p3 = next_probs([x1, x2])
                for x3 in range(v):
                    pair[x3] += p1[x1] * p2[x2] * p3[x3] * next_probs([x1, x2, x3])
    return pair


@pytest.mark.parametrize("kind", ["two", "four"])
def test_sampling_with_trees_follows_the_target_distribution(fake_clock, kind):
    """Trees of two drafters (a model, a deterministic one) or four (two models, two deterministic ones): the third and
    fourth new tokens, which the tree round after the first round decides unless that one kept three, follow the
    target's distribution (chi-square, as `tests/test_sampling.py`)."""
    target = sharpen(tiny_llama(10, vocab=SAMPLE_VOCAB), 3.0)
    models = [sharpen(tiny_llama(s, layers=1, vocab=SAMPLE_VOCAB), 3.0) for s in (11, 12)]
    pool = [models[0], Constant(3)] if kind == "two" else [models[0], Constant(3), models[1], Constant(0)]
    counts = torch.zeros(SAMPLE_VOCAB, SAMPLE_VOCAB)
    trees = 0
    torch.manual_seed(5)
    with fake_clock.charging((target, FLAT)):
        for _ in range(SAMPLES):
            out = target.generate(
                SAMPLE_PROMPT,
                do_sample=True,
                top_k=0,
                max_new_tokens=4,
                custom_generate=hf_metasd.generate,
                assistant_models=pool,
                num_assistant_tokens=2,
                meta_tree=True,
                meta_no_draft=False,
                return_dict_in_generate=True,
            )
            counts[out.sequences[0, -2], out.sequences[0, -1]] += 1
            trees += tree_rounds(out.metasd)
    assert trees > SAMPLES / 4
    assert _chi_square_p(counts, _exact_pair(target)) > 1e-3
