"""The peer matrix: the lossless contract over tiny models of many architecture families.

Each family is a tiny random model built from its config (2 layers, hidden size 32, the shared test vocabulary; seeds
fixed): plain attention with rotary positions (llama, qwen2, qwen3, phi3, gemma, starcoder2, olmo, gpt_neox, falcon),
sliding-window attention (mistral and gemma2 with a 4-token window, shorter than every sequence here), mixture of
experts (mixtral, qwen2_moe), absolute positions (gpt2, opt), ALiBi (bloom), recurrent state-space models (mamba,
mamba2, falcon_mamba) and hybrids of attention and recurrent layers (jamba, bamba, falcon_h1, zamba2, qwen3_next).
transformers' own ``assistant_model=`` assisted decoding works on every one of them (`test_peer_...`), and so must
MetaSD, through both entry points, for pools of an exact copy of the target (every drafted token accepted), a
perturbed copy (partial acceptance), prompt lookup, and all three at once.

Recurrent layers cannot drop tokens from their state, so verification records the state after each token it feeds
and restores the one where the kept tokens end; the contract checks that it is exactly that state (the scores of
every step, not only the tokens, are the target's own), and that a drafter's own recurrent cache is rolled back as
exactly (an exact copy of the target that drafts is scored with a total-variation distance of 0 to the target).

A model whose forward pass returns no cache (RecurrentGemma keeps its recurrent state inside its modules) cannot be
rolled back at all: transformers' ``assistant_model=`` fails on it after its first forward pass, MetaSD refuses it
before any.
"""

from __future__ import annotations

import copy

import pytest
import torch
import transformers
from conftest import VOCAB
from test_drafter_caches import _catch_up_and_check, _draft_and_check, _verified

import hf_metasd
from hf_metasd.drafters import ModelDrafter, PromptLookupDrafter
from hf_metasd.errors import MetaSDConfigError

MAX_NEW = 12
N = 4  # num_assistant_tokens: each verification pass feeds up to N + 1 tokens
_ATTENTION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2}
_HEADS = {"num_attention_heads": 4, "num_key_value_heads": 2}

#: family -> (config class, model class, config arguments besides the vocabulary and special tokens)
ARCHITECTURES: dict[str, tuple[str, str, dict]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {**_ATTENTION, **_HEADS}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {**_ATTENTION, **_HEADS}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {**_ATTENTION, **_HEADS, "head_dim": 8}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {**_ATTENTION, **_HEADS}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {**_ATTENTION, **_HEADS, "head_dim": 8}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {**_ATTENTION, **_HEADS, "head_dim": 8, "sliding_window": 4}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {**_ATTENTION, **_HEADS, "sliding_window": 4}),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {**_ATTENTION, **_HEADS, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {
            **_ATTENTION,
            **_HEADS,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
    ),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128}),
    "bloom": ("BloomConfig", "BloomForCausalLM", {"hidden_size": 32, "n_layer": 2, "n_head": 4}),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {**_ATTENTION, "num_attention_heads": 4}),
    "opt": (
        "OPTConfig",
        "OPTForCausalLM",
        {
            "hidden_size": 32,
            "ffn_dim": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "word_embed_proj_dim": 32,
            "max_position_embeddings": 128,
        },
    ),
    "falcon": (
        "FalconConfig",
        "FalconForCausalLM",
        {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4},
    ),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {**_ATTENTION, **_HEADS}),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", {**_ATTENTION, **_HEADS}),
    "mamba": ("MambaConfig", "MambaForCausalLM", {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 8}),
    "mamba2": (
        "Mamba2Config",
        "Mamba2ForCausalLM",
        {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 8, "num_heads": 4, "head_dim": 16, "n_groups": 1},
    ),
    "falcon_mamba": (
        "FalconMambaConfig",
        "FalconMambaForCausalLM",
        {"hidden_size": 32, "num_hidden_layers": 2, "state_size": 8},
    ),
    "jamba": (
        "JambaConfig",
        "JambaForCausalLM",
        {
            **_ATTENTION,
            **_HEADS,
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 2,
            "num_experts_per_tok": 1,
            "mamba_d_state": 8,
        },
    ),
    "bamba": (
        "BambaConfig",
        "BambaForCausalLM",
        {
            **_ATTENTION,
            **_HEADS,
            "attn_layer_indices": [1],
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_d_state": 8,
            "mamba_chunk_size": 8,
        },
    ),
    "falcon_h1": (
        "FalconH1Config",
        "FalconH1ForCausalLM",
        {
            **_ATTENTION,
            **_HEADS,
            "head_dim": 8,
            "mamba_d_ssm": 64,
            "mamba_n_heads": 4,
            "mamba_d_head": 16,
            "mamba_d_state": 8,
            "mamba_chunk_size": 8,
        },
    ),
    "zamba2": (
        "Zamba2Config",
        "Zamba2ForCausalLM",
        {
            **_ATTENTION,
            "num_attention_heads": 4,
            "layers_block_type": ["mamba", "hybrid"],
            "mamba_d_state": 8,
            "n_mamba_heads": 4,
            "chunk_size": 8,
            "adapter_rank": 8,
        },
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {
            **_ATTENTION,
            **_HEADS,
            "layer_types": ["linear_attention", "full_attention"],
            "head_dim": 8,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        },
    ),
}
#: a model whose forward pass returns no cache (its recurrent state lives inside its modules): not in the matrix
RECURRENT_GEMMA = (
    "RecurrentGemmaConfig",
    "RecurrentGemmaForCausalLM",
    {**_ATTENTION, "num_attention_heads": 4, "block_types": ["recurrent", "attention"], "attention_window_size": 16},
)
#: the families with recurrent layers (their cache records states, not keys and values)
RECURRENT = ("mamba", "mamba2", "falcon_mamba", "jamba", "bamba", "falcon_h1", "zamba2", "qwen3_next")
FAMILIES = sorted(ARCHITECTURES)
POOLS = ("copy", "perturbed", "prompt_lookup", "mixed")
ENTRY_POINTS = ("enable", "custom_generate")
#: prompts that repeat themselves (prompt lookup finds n-grams to draft from)
PROMPTS = [torch.tensor([[5, 17, 42, 8, 5, 17, 42]]), torch.tensor([[3, 61, 3, 61, 29, 3, 61, 29]])]


def build(family: str, *, seed: int = 0, attn_implementation: str | None = None) -> torch.nn.Module:
    """A tiny random model of `family`, in eval mode, that never stops early (no eos); `attn_implementation` is set
    in its config before it is built (transformers 5.24 cannot switch some families, falcon among them, afterwards)."""
    config_class, model_class, kwargs = {**ARCHITECTURES, "recurrent_gemma": RECURRENT_GEMMA}[family]
    torch.manual_seed(seed)
    if attn_implementation is not None:
        kwargs = {**kwargs, "attn_implementation": attn_implementation}
    config = getattr(transformers, config_class)(
        vocab_size=VOCAB, pad_token_id=0, bos_token_id=0, eos_token_id=None, **kwargs
    )
    model = getattr(transformers, model_class)(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def perturbed(model: torch.nn.Module, *, scale: float = 0.3, seed: int = 1) -> torch.nn.Module:
    """A copy of `model` with Gaussian noise of `scale` times each weight tensor's spread added to every weight."""
    noisy = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in noisy.parameters():
            if param.numel() > 1:
                param.add_(torch.randn(param.shape, generator=generator) * scale * param.std())
    return noisy


class Family:
    """One family's target, its drafters and its plain-`generate` references, built once per module."""

    def __init__(self, family: str):
        self.target = build(family)
        self.copy = copy.deepcopy(self.target)
        self.perturbed = perturbed(self.target)
        self.references = [self.target.generate(p, do_sample=False, max_new_tokens=MAX_NEW) for p in PROMPTS]

    def pool(self, kind: str) -> list:
        copy_, noisy = ModelDrafter(self.copy, name="copy"), ModelDrafter(self.perturbed, name="perturbed")
        return {
            "copy": [copy_],
            "perturbed": [noisy],
            "prompt_lookup": [PromptLookupDrafter()],
            "mixed": [noisy, PromptLookupDrafter(), copy_],
        }[kind]


@pytest.fixture(scope="module")
def families():
    built: dict[str, Family] = {}

    def get(family: str) -> Family:
        if family not in built:
            built[family] = Family(family)
        return built[family]

    return get


def metasd(model, prompt, pool, *, entry: str, **kwargs):
    """MetaSD through one entry point: ``enable()`` + ``assistant_models=``, or ``custom_generate=``."""
    kwargs = {"max_new_tokens": MAX_NEW, "do_sample": False, "assistant_models": pool, **kwargs}
    if entry == "enable":
        hf_metasd.enable()
        return model.generate(prompt, **kwargs)
    return model.generate(prompt, custom_generate=hf_metasd.generate, **kwargs)


def stateful(fam) -> bool:
    """transformers before 5.25 marks recurrent models stateful and refuses them in its own assisted decoding (as
    target and as assistant); MetaSD refuses them there too, before any compute
    (`test_a_stateful_target_is_refused_where_the_peer_refuses_it`), and the contract tests skip them."""
    return bool(getattr(fam.target, "_is_stateful", False))


def skip_if_stateful(fam) -> None:
    if stateful(fam):
        pytest.skip(f"transformers {transformers.__version__} refuses {type(fam.target).__name__} (stateful)")


def test_the_matrix_covers_each_kind_of_cache():
    """The families hold what the module docstring says: recurrent layers exactly in `RECURRENT`, sliding-window
    layers in mistral and gemma2, and at least 12 families."""
    from transformers import DynamicCache

    def kinds(family: str) -> set[str]:
        layers = DynamicCache(config=build(family).config).layers
        recurrent = {"recurrent" for layer in layers if hasattr(layer, "recurrent_states")}
        return recurrent | {"sliding" for layer in layers if getattr(layer, "is_sliding", False)}

    found = {family: kinds(family) for family in FAMILIES}
    assert sorted(f for f, k in found.items() if "recurrent" in k) == sorted(RECURRENT)
    assert {f for f, k in found.items() if "sliding" in k} >= {"mistral", "gemma2"}
    assert len(FAMILIES) >= 12


# ---------------------------------------------------------------------------------------------------------------------
# the peer: transformers' own assisted decoding works on every family of the matrix
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_peer_assisted_decoding_works_on_every_family(families, family):
    """transformers' ``assistant_model=`` (an exact copy drafting N tokens a round) gives the plain greedy output."""
    fam = families(family)
    skip_if_stateful(fam)
    assistant = copy.deepcopy(fam.copy)
    assistant.generation_config.num_assistant_tokens = N
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    assistant.generation_config.assistant_confidence_threshold = 0.0  # draft all N (tiny models are unconfident)
    out = fam.target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, assistant_model=assistant)
    assert torch.equal(out, fam.references[0])


# ---------------------------------------------------------------------------------------------------------------------
# the contract
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_output_is_plain_generates(families, family, pool):
    """Policies ``ucb`` and the default, both entry points, every prompt: the plain greedy output."""
    fam = families(family)
    skip_if_stateful(fam)
    drafted = accepted = 0
    for policy, entry in (("ucb", "enable"), (None, "custom_generate")):
        for prompt, reference in zip(PROMPTS, fam.references):
            settings = {} if policy is None else {"meta_policy": policy}
            out = metasd(
                fam.target,
                prompt,
                fam.pool(pool),
                entry=entry,
                num_assistant_tokens=N,
                return_dict_in_generate=True,
                **settings,
            )
            assert torch.equal(out.sequences, reference), f"{family}, {pool} pool, {policy or 'default'} policy"
            drafted += sum(out.metasd.drafted)
            accepted += sum(out.metasd.accepted)
            hf_metasd.disable()
    assert drafted > 0, f"{family}: the {pool} pool never drafted"
    if pool == "copy":
        assert accepted == drafted, f"{family}: an exact copy had {drafted - accepted} of {drafted} tokens rejected"


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_scores_and_logits_are_plain_generates(families, family, entry):
    """With every output asked for, sequences, scores and logits are plain `generate`'s, step by step. Fixed draft
    length N: the verification passes feed N + 1 tokens and roll back up to N of them (the perturbed copy, the
    exact copy and prompt lookup all draft)."""
    fam = families(family)
    skip_if_stateful(fam)
    asked = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
    for prompt in PROMPTS:
        plain = fam.target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, **asked)
        out = metasd(
            fam.target,
            prompt,
            fam.pool("mixed"),
            entry=entry,
            meta_policy="round_robin",
            meta_draft_length="fixed",
            num_assistant_tokens=N,
            **asked,
        )
        hf_metasd.disable()
        assert isinstance(out, hf_metasd.MetaSDGenerateOutput)
        assert torch.equal(out.sequences, plain.sequences)
        for name in ("scores", "logits"):
            ours, theirs = getattr(out, name), getattr(plain, name)
            assert len(ours) == len(theirs) == MAX_NEW
            for step, (a, b) in enumerate(zip(ours, theirs)):
                assert a.shape == b.shape == (1, VOCAB)
                torch.testing.assert_close(
                    a, b, atol=2e-6, rtol=0, msg=lambda m, n=name, s=step: f"{family}: {n} at step {s}. {m}"
                )
        assert max(out.metasd.drafted) == N and min(out.metasd.accepted) < N  # full drafts, rejections among them


@pytest.mark.parametrize(
    "family",
    FAMILIES,
)
def test_an_exact_copy_drafts_the_targets_own_distribution(families, family):
    """An exact copy of the target that takes turns with prompt lookup catches up on several tokens at once after
    each round of the other: if its cache holds exactly the target's states, its distribution is the target's at every
    drafted position (BD reward 1) and the target keeps every drafted token."""
    fam = families(family)
    skip_if_stateful(fam)
    rounds = 0
    for prompt, reference in zip(PROMPTS, fam.references):
        out = metasd(
            fam.target,
            prompt,
            [ModelDrafter(fam.copy, name="copy"), PromptLookupDrafter()],
            entry="custom_generate",
            meta_policy="round_robin",
            meta_reward="bd",
            meta_draft_length="fixed",
            num_assistant_tokens=N,
            max_new_tokens=3 * MAX_NEW,
            return_dict_in_generate=True,
        )
        assert torch.equal(out.sequences[:, : reference.shape[1]], reference)
        stats = out.metasd
        mine = [r for r, (arm, drafted) in enumerate(zip(stats.arms, stats.drafted)) if arm == 0 and drafted > 0]
        rounds += len(mine)
        assert [stats.accepted[r] for r in mine] == [stats.drafted[r] for r in mine], f"{family}: {stats.accepted}"
        assert all(stats.rewards[r] == pytest.approx(1.0, abs=1e-5) for r in mine), f"{family}: {stats.rewards}"
    assert rounds >= 4


@pytest.mark.parametrize("family", RECURRENT)
def test_a_recurrent_drafters_cache_matches_a_fresh_forward(families, family):
    """A model drafter of each recurrent family drafts N tokens, loses all but `accepted` of them, and catches up;
    then the sequence moves on by 6 tokens it did not draft (other drafters' rounds) and it catches up on them in one
    pass. Its logits at every position it ingests, and its drafts, are those of a fresh forward pass over the whole
    sequence (the helpers of `test_drafter_caches`)."""
    fam = families(family)
    skip_if_stateful(fam)
    for accepted in range(N):
        drafter = ModelDrafter(fam.copy, name="copy").spawn(fam.target)
        ids = PROMPTS[1]
        _catch_up_and_check(drafter, ids, 0, f"{family}: prompt prefill")
        for round_ in range(2):
            draft = _draft_and_check(drafter, ids, N, f"{family}, round {round_}")
            cached = ids.shape[1] + accepted
            ids = _verified(ids, draft, accepted)
            _catch_up_and_check(drafter, ids, cached, f"{family}, round {round_}, {accepted}/{N} accepted")
        draft = _draft_and_check(drafter, ids, N, f"{family}: the draft after the last rejection")
        cached = ids.shape[1]  # what it holds in common with the sequence: the others' first token is not its own
        others = torch.tensor([[(int(draft[0]) + 1) % VOCAB, 11, 23, 35, 47, 59]])
        ids = torch.cat([ids, others], dim=-1)
        _catch_up_and_check(drafter, ids, cached, f"{family}: 6 tokens drafted by others")
        _draft_and_check(drafter, ids, N, f"{family}: the draft after the others' rounds")


@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_smoke(families, family):
    fam = families(family)
    skip_if_stateful(fam)
    torch.manual_seed(0)
    prompt = PROMPTS[1]
    out = fam.target.generate(
        prompt,
        do_sample=True,
        top_k=20,
        max_new_tokens=MAX_NEW,
        custom_generate=hf_metasd.generate,
        assistant_models=fam.pool("mixed"),
        meta_policy="ucb",
        num_assistant_tokens=N,
        return_dict_in_generate=True,
    )
    assert out.sequences.shape == (1, prompt.shape[1] + MAX_NEW)
    assert torch.equal(out.sequences[:, : prompt.shape[1]], prompt)
    assert int(out.sequences.min()) >= 0 and int(out.sequences.max()) < VOCAB
    assert sum(out.metasd.drafted) > 0


# ---------------------------------------------------------------------------------------------------------------------
# a model whose outputs carry no cache: transformers' assisted decoding fails on it, MetaSD refuses it up front
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def recurrent_gemma():
    return build("recurrent_gemma")


def test_peer_assisted_decoding_fails_on_a_model_without_a_cache_in_its_outputs(recurrent_gemma):
    # transformers 5.25 fails after its first forward pass; earlier versions refuse the stateful model up front
    message = "'CausalLMOutput' object has no attribute 'cache'|assisted generation is not supported with stateful"
    with pytest.raises((AttributeError, ValueError), match=message):
        recurrent_gemma.generate(
            PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, assistant_model=copy.deepcopy(recurrent_gemma)
        )


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_target_without_a_cache_in_its_outputs_is_refused_before_any_forward_pass(recurrent_gemma, entry):
    passes = []
    handle = recurrent_gemma.register_forward_pre_hook(lambda *args: passes.append(1))
    try:
        with pytest.raises(
            MetaSDConfigError,
            match=r"the target's outputs must carry its cache .*, but RecurrentGemmaForCausalLM returns "
            r"CausalLMOutput, which has none .* Call `generate` without `assistant_models`"
            r"|the target must be able to roll back its cache, but RecurrentGemmaForCausalLM is stateful",
        ):
            metasd(recurrent_gemma, PROMPTS[0], [PromptLookupDrafter()], entry=entry)
    finally:
        handle.remove()
    assert passes == []
    # the fix the message suggests: plain generate
    hf_metasd.disable()
    out = recurrent_gemma.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW)
    assert out.shape == (1, PROMPTS[0].shape[1] + MAX_NEW)


def test_a_target_whose_forward_is_not_annotated_is_not_refused():
    """The refusal reads the output class from `forward`'s annotation; a `forward` without one (a user's wrapper) is
    served as before."""

    class Wrapped(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):  # no return annotation
            return super().forward(*args, **kwargs)

    target = build("llama")
    wrapped = Wrapped(target.config).eval()
    wrapped.load_state_dict(target.state_dict())
    wrapped.generation_config = target.generation_config
    out = metasd(wrapped, PROMPTS[0], [PromptLookupDrafter()], entry="custom_generate")
    assert torch.equal(out, target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW))


@pytest.mark.parametrize("family", RECURRENT)
def test_a_stateful_target_is_refused_where_the_peer_refuses_it(families, family):
    """Where transformers marks a recurrent model stateful (before 5.25), its assisted decoding refuses it and so does
    MetaSD, on both entry points, before any forward pass."""
    fam = families(family)
    if not stateful(fam):
        pytest.skip(f"transformers {transformers.__version__} serves {type(fam.target).__name__} (not stateful)")
    with pytest.raises(ValueError, match="assisted generation is not supported with stateful"):
        fam.target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, assistant_model=fam.copy)
    passes = []
    handle = fam.target.register_forward_pre_hook(lambda *args: passes.append(1))
    try:
        for entry in ENTRY_POINTS:
            with pytest.raises(MetaSDConfigError, match=r"the target must be able to roll back its cache, but .* is "):
                metasd(fam.target, PROMPTS[0], fam.pool("mixed"), entry=entry)
    finally:
        handle.remove()
    assert passes == []


def _assert_same_steps(ours, plain, what: str) -> None:
    """Per generated token, per layer: plain `generate`'s shapes and (to rounding) its values."""
    assert len(ours) == len(plain) == MAX_NEW, what
    for step, (our_step, plain_step) in enumerate(zip(ours, plain, strict=True)):
        assert len(our_step) == len(plain_step), f"{what}, step {step}"
        for layer, (a, b) in enumerate(zip(our_step, plain_step, strict=True)):
            assert (a is None) == (b is None), f"{what}, step {step}, layer {layer}"
            if a is None:
                continue
            assert a.shape == b.shape, f"{what}, step {step}, layer {layer}: {tuple(a.shape)} != {tuple(b.shape)}"
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=f"{what}, step {step}, layer {layer}")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("family", FAMILIES)
def test_attentions_and_hidden_states_are_plain_generates(families, family, entry):
    """With ``output_attentions`` and ``output_hidden_states``, every step's tensors have plain `generate`'s shapes
    and values (the check of transformers' assisted-decoding tests: step 0 attends over the prompt, step i over the
    prompt and i more keys). On hybrid caches the cache length is a tensor the pass updates in place: read before
    the pass, it must not move with it, or each step carries the candidates' key columns too."""
    fam = families(family)
    skip_if_stateful(fam)
    target = build(family, attn_implementation="eager")  # sdpa returns no attentions
    # a model without attention layers has no `attentions` in its outputs (plain `generate` fails on asking for them)
    attentions = family not in ("mamba", "mamba2", "falcon_mamba")
    asked = {"return_dict_in_generate": True, "output_attentions": attentions, "output_hidden_states": True}
    prompt = PROMPTS[0]
    plain = target.generate(prompt, do_sample=False, max_new_tokens=MAX_NEW, **asked)
    out = metasd(
        target,
        prompt,
        fam.pool("mixed"),
        entry=entry,
        meta_policy="round_robin",
        meta_draft_length="fixed",
        num_assistant_tokens=N,
        **asked,
    )
    hf_metasd.disable()
    assert torch.equal(out.sequences, plain.sequences)
    _assert_same_steps(out.hidden_states, plain.hidden_states, f"{family}: hidden states")
    if attentions:
        _assert_same_steps(out.attentions, plain.attentions, f"{family}: attentions")
        first = next(a for a in out.attentions[0] if a is not None)
        assert first.shape[-2:] == (prompt.shape[1], prompt.shape[1])
    assert max(out.metasd.drafted) == N and min(out.metasd.accepted) < N  # full drafts, rejections among them


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_attentions_asked_of_an_sdpa_target_are_plain_generates_empty_steps(families, entry):
    """Under sdpa a forward pass returns no attentions (an empty tuple): plain `generate` returns one empty tuple per
    step, and so does MetaSD (it used to fail on the empty tuple)."""
    fam = families("llama")
    assert fam.target.config._attn_implementation == "sdpa"
    asked = {"return_dict_in_generate": True, "output_attentions": True}
    plain = fam.target.generate(PROMPTS[0], do_sample=False, max_new_tokens=MAX_NEW, **asked)
    out = metasd(fam.target, PROMPTS[0], fam.pool("mixed"), entry=entry, num_assistant_tokens=N, **asked)
    hf_metasd.disable()
    assert torch.equal(out.sequences, plain.sequences)
    assert plain.attentions == out.attentions == ((),) * MAX_NEW
