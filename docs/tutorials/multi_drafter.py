"""Multi-drafter generation: both entry points, telemetry, and a check that the output is the target's own.

Runs in seconds on a CPU: every model is a tiny random Llama built from a config (no download).
Run it from the repository root: ``python docs/tutorials/multi_drafter.py``.
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd

torch.set_num_threads(1)  # tiny models: one thread is fastest


def tiny_llama(seed: int, layers: int = 2) -> LlamaForCausalLM:
    """A random Llama with hidden size 32 and a 96-token vocabulary (same seed, same weights)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # random tiny models are near-uniform: sharpen them
    model.generation_config.eos_token_id = None  # always generate max_new_tokens
    model.generation_config.pad_token_id = 0
    return model


# --8<-- [start:models]
target = tiny_llama(seed=0)

# A pool of three drafters sharing the target's vocabulary. Two are unrelated random models; one is a 1-layer model
# holding the target's first layer, embeddings, norm and head, a stand-in for a good drafter. The policy does not
# know which is which: it has to find out.
good = tiny_llama(seed=0, layers=1)
with torch.no_grad():
    good.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    good.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    good.model.norm.weight.copy_(target.model.norm.weight)
    good.lm_head.weight.copy_(target.lm_head.weight)
pool = [
    hf_metasd.ModelDrafter(tiny_llama(seed=1, layers=1), name="random-1"),
    hf_metasd.ModelDrafter(good, name="good"),
    tiny_llama(seed=2, layers=1),  # a bare model works too: it is wrapped in a ModelDrafter, named after its class
]

torch.manual_seed(1234)
input_ids = torch.randint(1, 96, (1, 8))
# --8<-- [end:models]

# --8<-- [start:reference]
reference = target.generate(input_ids, do_sample=False, max_new_tokens=64)  # plain greedy, no drafter
# --8<-- [end:reference]

# --8<-- [start:custom_generate]
# Entry point 1: transformers' own hook. Nothing is patched.
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=64,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference), "MetaSD must not change the greedy output"
# --8<-- [end:custom_generate]

# --8<-- [start:telemetry]
stats = out.metasd  # a hf_metasd.MetaSDStats
print(stats.summary())
print("drafter of each round:", stats.arms)
print("pulls per drafter:    ", dict(zip(stats.drafter_names, stats.pulls)))
print(f"tokens per round:      {stats.tokens / stats.rounds:.2f} (1 = no drafted token was accepted)")
# --8<-- [end:telemetry]

# --8<-- [start:enable]
# Entry point 2: let every model's `generate` take `assistant_models=` directly.
hf_metasd.enable()
try:
    sequences = target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=64,
        assistant_models=pool,
        meta_policy="thompson",  # any registered policy, by name
        meta_policy_kwargs={"seed": 0},
        meta_reward="be",  # block efficiency instead of the default block divergence
        num_assistant_tokens=4,  # tokens drafted per round
    )
    assert torch.equal(sequences, reference)
    # Without `assistant_models` the call is stock transformers.
    assert torch.equal(target.generate(input_ids, do_sample=False, max_new_tokens=64), reference)
finally:
    hf_metasd.disable()  # restore transformers' own `generate`
# --8<-- [end:enable]

# --8<-- [start:instance]
# A policy passed by name starts fresh every call. An instance keeps learning across calls.
policy = hf_metasd.get_policy("ucb", beta=0.5)
for _ in range(3):
    target.generate(
        input_ids,
        do_sample=False,
        max_new_tokens=16,
        custom_generate=hf_metasd.generate,
        assistant_models=pool,
        meta_policy=policy,
    )
print("UCB after 3 calls: pulls", policy.counts, "mean rewards", [round(m, 3) for m in policy.means()])
# --8<-- [end:instance]

# --8<-- [start:sampling]
# Sampling stays lossless too (speculative sampling): the output has the target's distribution, so compare
# distributions, not single samples. Here we only check it runs and reports telemetry.
torch.manual_seed(0)
sampled = target.generate(
    input_ids,
    do_sample=True,
    max_new_tokens=16,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    return_dict_in_generate=True,
)
print("sampled", sampled.sequences.shape[1] - input_ids.shape[1], "tokens in", sampled.metasd.rounds, "rounds")
# --8<-- [end:sampling]
