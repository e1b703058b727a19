"""Mix drafter kinds in one pool: prompt lookup (model-free), early exit (the target's own first layers), a small LM.

Run it from the repository root: ``python docs/tutorials/mixed_drafters.py`` (a few seconds, no download).
"""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd
from hf_metasd.drafters import (
    EarlyExitDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    TokenRecyclingDrafter,
    prompt_lookup_candidates,
)

torch.set_num_threads(1)


def tiny_llama(seed: int, layers: int) -> LlamaForCausalLM:
    """A random Llama with hidden size 32 and a 96-token vocabulary."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # sharpen the near-uniform random distributions
    model.generation_config.eos_token_id = None
    return model


target = tiny_llama(0, layers=4)

# --8<-- [start:lookup]
# Prompt lookup: find the last n-gram earlier in the sequence and propose what followed it. No model, no cost.
sequence = torch.tensor([5, 6, 7, 8, 9, 1, 5, 6])
print("lookup proposes", prompt_lookup_candidates(sequence, num_output_tokens=3).tolist())  # "5 6" -> 7 8 9
# --8<-- [end:lookup]

# --8<-- [start:early_exit]
# Early exit: the target's first layer, then its final norm and LM head. No weight is copied.
shallow = EarlyExitDrafter(target, num_layers=1)
assert shallow.model.lm_head.weight is target.lm_head.weight
print(shallow, "- shares the target's weights, keeps its own KV cache")
# --8<-- [end:early_exit]

# --8<-- [start:pool]
pool = [
    PromptLookupDrafter(max_matching_ngram_size=3),
    shallow,
    EarlyExitDrafter(target, num_layers=2),
    ModelDrafter(tiny_llama(7, layers=1), name="small-lm"),
]
# A prompt that repeats itself, as a summary or a code edit of the input would.
input_ids = torch.tensor([[11, 12, 13, 14, 15, 16, 40, 41, 11, 12, 13, 14, 15, 16, 40, 41, 11, 12]])
reference = target.generate(input_ids, do_sample=False, max_new_tokens=48)
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=48,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)
print(out.metasd.summary())
# --8<-- [end:pool]

# --8<-- [start:reward]
# Look at the rewards above. BD is the acceptance probability under speculative *sampling*: for prompt lookup (no
# logits) it is p_target(x_j), which is small when the target's distribution is flat (random tiny models are), even
# when greedy decoding accepts every looked-up token. Under greedy decoding a token is accepted iff it is the target's
# argmax, and BE (accepted / drafted) measures exactly that. With greedy decoding and deterministic drafters in the
# pool, compare both rewards:
out_be = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=48,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    meta_reward="be",
    return_dict_in_generate=True,
)
assert torch.equal(out_be.sequences, reference)  # the reward changes the speed, never the output
for name, stats in (("bd", out.metasd), ("be", out_be.metasd)):
    print(f"reward={name}: {stats.rounds} rounds for 48 tokens, pulls {dict(zip(stats.drafter_names, stats.pulls))}")
# --8<-- [end:reward]

# --8<-- [start:sampling]
# Sampling: drafters with logits go through speculative sampling; prompt lookup has no logits, so its tokens are
# checked by sample-and-compare (the target samples its own token at each position and keeps the draft only while
# they agree). Either way the output is distributed exactly as the target's own samples.
torch.manual_seed(0)
sampled = target.generate(
    input_ids,
    do_sample=True,
    temperature=0.7,
    max_new_tokens=24,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    return_dict_in_generate=True,
)
print("sampled:", sampled.sequences[0, input_ids.shape[1] :].tolist())
print("rounds per drafter:", dict(zip(sampled.metasd.drafter_names, sampled.metasd.pulls)))
# --8<-- [end:sampling]

# --8<-- [start:recycling]
# Token recycling: a table of the target's own most likely next token after each token, learnt from every
# verification pass (the scores a pass computes for rejected tokens included). It needs no model and no training;
# the table belongs to the drafter, so the next call starts from what this one taught it.
recycling = TokenRecyclingDrafter()
first = target.generate(
    input_ids, do_sample=False, max_new_tokens=48, custom_generate=hf_metasd.generate, assistant_models=[recycling]
)
print(f"after one call the table holds {len(recycling.table)} tokens")

# Per round, not per call: `throughput` previews every model-free arm's proposal for this position and picks the
# arm with the most expected tokens per second: a copier where its match is long, the model drafter elsewhere.
mixed = [ModelDrafter(tiny_llama(7, layers=1), name="small-lm"), PromptLookupDrafter(), recycling]
out_tp = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=48,
    custom_generate=hf_metasd.generate,
    assistant_models=mixed,
    meta_policy="throughput",
    return_dict_in_generate=True,
)
assert torch.equal(out_tp.sequences, reference)
names = out_tp.metasd.drafter_names
print("arm of each round:", [names[arm] for arm in out_tp.metasd.arms])
# --8<-- [end:recycling]
