"""Drafters see what the target sees: their KV caches after partial acceptance, and the call's logits processors.

Every model-backed drafter kind keeps a KV cache across rounds and crops it to what the target kept. Here each one
drafts, the sequence moves on as verification would move it (an accepted prefix of the draft and one other token, the
whole draft and a bonus token, or several rounds drafted by another drafter), and the drafter's logits at the
positions it ingests, and its next draft, are compared with a fresh forward pass of the same model over the whole
sequence (no cache). A cache that is one token off gives other logits.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from conftest import VOCAB, greedy, metasd_greedy, prompts, sharpen, tiny_llama
from peft import LoraConfig, get_peft_model

from hf_metasd.drafters import Drafter, EarlyExitDrafter, LoraDrafter, ModelDrafter

ATOL = 1e-5
PROMPT = prompts(1, seed=31, min_len=6, max_len=6)[0]
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
HEAD = torch.arange(0, VOCAB, 2)  # a restricted head: even ids only


def _peft_model(seed: int):
    """A 1-layer base with two distinct random adapters (init_lora_weights=False: they change the output)."""
    torch.manual_seed(seed)
    model = get_peft_model(sharpen(tiny_llama(seed, layers=1)), LORA, adapter_name="code")
    model.add_adapter("math", LORA)
    return model.eval()


def _lora(seed: int, head: torch.Tensor | None = None) -> list[Drafter]:
    return LoraDrafter.from_peft_model(_peft_model(seed), head_token_ids=head)


def _assistant(head: torch.Tensor | None = None) -> list[Drafter]:
    shared = ModelDrafter(sharpen(tiny_llama(2, layers=1)), name="small", head_token_ids=head)
    return [shared, shared]  # the other drafter: a second per-call copy of the same shared drafter (same model)


#: case -> (subject, other drafter of the same pool) for the session target. Each model-backed kind, with and without
#: the things that change its forward pass (a restricted head, an adapter). The second drafter shares what a real pool
#: shares with the first: the same model, the same peft base (another adapter), the same target layers.
CASES: dict[str, Callable[[torch.nn.Module], list[Drafter]]] = {
    "assistant_model": lambda target: _assistant(),
    "assistant_model_head": lambda target: _assistant(HEAD),
    "lora": lambda target: _lora(5),
    "lora_head": lambda target: _lora(6, HEAD),
    "early_exit": lambda target: [
        EarlyExitDrafter(target, num_layers=1),
        EarlyExitDrafter(target, num_layers=1, adapter=LORA, name="ee_lora"),
    ],
    "early_exit_adapter": lambda target: [
        EarlyExitDrafter(target, num_layers=1, adapter=LORA, name="ee_lora"),
        EarlyExitDrafter(target, num_layers=1),
    ],
}


def _pair(target, case: str) -> tuple[Drafter, Drafter]:
    torch.manual_seed(0)  # the adapters' random initialisation
    subject, other = CASES[case](target)
    return subject.spawn(target), other.spawn(target)


@torch.no_grad()
def _fresh_logits(drafter: Drafter, ids: torch.Tensor) -> torch.Tensor:
    """The drafter's model over the whole of `ids` without a cache (its adapter on, its head restricted)."""
    if isinstance(drafter, LoraDrafter):
        drafter.activate()
    logits = drafter.model(input_ids=ids).logits.float()
    if drafter.head_token_ids is not None:
        masked = torch.full_like(logits, float("-inf"))
        masked[..., drafter.head_token_ids] = logits[..., drafter.head_token_ids]
        logits = masked
    return logits


def _fresh_draft(drafter: Drafter, ids: torch.Tensor, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy drafting with a fresh forward pass per token: ``(1, n)`` tokens and ``(1, n, V)`` logits."""
    tokens, logits = [], []
    for _ in range(num_tokens):
        step = _fresh_logits(drafter, ids)[:, -1]
        token = step.argmax(dim=-1, keepdim=True)
        tokens.append(token)
        logits.append(step)
        ids = torch.cat([ids, token], dim=-1)
    return torch.cat(tokens, dim=-1), torch.stack(logits, dim=1)


def _verified(ids: torch.Tensor, draft: torch.Tensor, accepted: int) -> torch.Tensor:
    """The sequence after verification: `ids`, the first `accepted` drafted tokens, then the target's own token (one
    other than the next drafted token; after the whole draft, a bonus token)."""
    after = int(draft[min(accepted, draft.shape[0] - 1)])
    return torch.cat([ids, draft[None, :accepted], torch.tensor([[(after + 1) % VOCAB]])], dim=-1)


def _draft_and_check(drafter: Drafter, ids: torch.Tensor, num_tokens: int, what: str) -> torch.Tensor:
    """Let `drafter` draft from `ids` and check the draft against fresh forward passes; returns the draft ``(n,)``."""
    tokens, logits = drafter.draft(ids, num_tokens)
    expected_tokens, expected_logits = _fresh_draft(drafter, ids, num_tokens)
    torch.testing.assert_close(logits, expected_logits, atol=ATOL, rtol=0, msg=lambda m: f"{what}: draft logits. {m}")
    assert torch.equal(tokens, expected_tokens), f"{what}: drafted {tokens.tolist()}, fresh {expected_tokens.tolist()}"
    return tokens[0]


def _catch_up_and_check(drafter: Drafter, ids: torch.Tensor, cached: int, what: str) -> None:
    """Catch `drafter` up on `ids`, knowing its cache holds the first `cached` of them, and check the logits."""
    logits = drafter.catch_up(ids, return_logits=True)
    ingested = ids.shape[1] - cached
    assert logits.shape[1] == drafter.last_catch_up_tokens == ingested, (
        f"{what}: ingested {logits.shape[1]} positions ({drafter.last_catch_up_tokens} counted), expected {ingested}"
    )
    expected = _fresh_logits(drafter, ids)[:, -ingested:]
    torch.testing.assert_close(
        logits, expected, atol=ATOL, rtol=0, msg=lambda m: f"{what}: catch-up logits at the last {ingested}. {m}"
    )


def _held(length: int, num_tokens: int) -> int:
    """Positions a drafter's cache holds after drafting `num_tokens` from `length` tokens: those and every drafted
    token but the last (never fed)."""
    return length + num_tokens - 1


@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_catch_up_after_a_partial_rejection_matches_a_fresh_forward(target, case, num_tokens):
    """Round after round, the target accepts `k` drafted tokens and picks another token instead of the next one."""
    for accepted in range(num_tokens):
        drafter, _ = _pair(target, case)
        ids = PROMPT
        _catch_up_and_check(drafter, ids, 0, f"{case}: prompt prefill")
        for round_ in range(3):
            draft = _draft_and_check(drafter, ids, num_tokens, f"{case}, round {round_}")
            cached = ids.shape[1] + accepted  # the common prefix of what it holds and the new sequence
            ids = _verified(ids, draft, accepted)
            _catch_up_and_check(drafter, ids, cached, f"{case}, round {round_}, {accepted}/{num_tokens} accepted")
        _draft_and_check(drafter, ids, num_tokens, f"{case}: the draft after the last rejection")


@pytest.mark.parametrize("num_tokens", [1, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_catch_up_after_full_acceptance_and_a_bonus_token_matches_a_fresh_forward(target, case, num_tokens):
    drafter, _ = _pair(target, case)
    ids = PROMPT
    drafter.catch_up(ids)
    for round_ in range(3):
        draft = _draft_and_check(drafter, ids, num_tokens, f"{case}, round {round_}")
        held = _held(ids.shape[1], num_tokens)
        ids = _verified(ids, draft, num_tokens)
        # the last drafted token and the bonus token: the two positions the cache does not hold
        assert ids.shape[1] - held == 2
        _catch_up_and_check(drafter, ids, held, f"{case}, round {round_}: all {num_tokens} accepted + bonus")
    _draft_and_check(drafter, ids, num_tokens, f"{case}: the draft after full acceptance")


@pytest.mark.parametrize("accepted", [0, 2, 3])
@pytest.mark.parametrize("case", sorted(CASES))
def test_catch_up_after_rounds_drafted_by_another_drafter_matches_a_fresh_forward(target, case, accepted):
    """The subject drafts once; the other drafter (same model / base / layers) drafts the next rounds."""
    num_tokens = 3
    drafter, other = _pair(target, case)
    ids = PROMPT
    drafter.catch_up(ids)
    draft = _draft_and_check(drafter, ids, num_tokens, f"{case}: first draft")
    # it holds the prompt and the accepted tokens it fed (not the last drafted one: never fed)
    cached = min(_held(ids.shape[1], num_tokens), ids.shape[1] + accepted)
    ids = _verified(ids, draft, accepted)
    for round_, keep in enumerate((1, num_tokens, 0)):  # the other drafter's rounds: partly, fully, not accepted
        other.catch_up(ids)
        theirs = _draft_and_check(other, ids, num_tokens, f"{case}: the other drafter, round {round_}")
        ids = _verified(ids, theirs, keep)
    _catch_up_and_check(drafter, ids, cached, f"{case}: after 3 rounds of the other drafter")
    _draft_and_check(drafter, ids, num_tokens, f"{case}: the draft after the missed rounds")


@pytest.mark.parametrize("case", sorted(CASES))
def test_catching_up_again_on_a_held_sequence_refeeds_only_its_last_token(target, case):
    """A drafter already caught up (e.g. scored on the round in full-information mode) is caught up again on the same
    sequence before it drafts: it must still produce the next-token logits, from its last position only."""
    drafter, _ = _pair(target, case)
    ids = PROMPT
    drafter.catch_up(ids)
    draft = _draft_and_check(drafter, ids, 3, f"{case}: first draft")
    ids = _verified(ids, draft, 1)
    _catch_up_and_check(drafter, ids, ids.shape[1] - 1, f"{case}: after the round")
    _catch_up_and_check(drafter, ids, ids.shape[1] - 1, f"{case}: the same sequence again")
    _draft_and_check(drafter, ids, 3, f"{case}: the draft after catching up twice")


# ---------------------------------------------------------------------------------------------------------------------
# the call's logits processors reach the drafters
# ---------------------------------------------------------------------------------------------------------------------
def test_the_calls_logits_processors_reach_the_drafters(target, target_copy):
    """An exact copy of the target that drafts with the same processors as the target verifies with proposes exactly
    the target's tokens, and its processed distribution is the target's (BD reward 1). Drafting without them (e.g.
    `logits_processor=None` reaching the drafter) proposes tokens the repetition penalty or the n-gram ban would have
    changed: rejections, BD < 1."""
    kwargs = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}
    drafting_rounds = 0
    for prompt in prompts(4, seed=5):
        out = metasd_greedy(
            target,
            prompt,
            24,
            assistant_models=[target_copy],
            meta_reward="bd",
            num_assistant_tokens=4,
            return_dict_in_generate=True,
            **kwargs,
        )
        assert torch.equal(out.sequences, greedy(target, prompt, 24, **kwargs))
        stats = out.metasd
        rounds = [r for r, drafted in enumerate(stats.drafted) if drafted > 0]
        drafting_rounds += len(rounds)
        assert [stats.accepted[r] for r in rounds] == [stats.drafted[r] for r in rounds], (
            f"drafted {stats.drafted}, accepted {stats.accepted}"
        )
        assert all(stats.rewards[r] == pytest.approx(1.0, abs=1e-5) for r in rounds), stats.rewards
    assert drafting_rounds >= 1
