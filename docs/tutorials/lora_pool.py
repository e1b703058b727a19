"""A pool of LoRA drafters on one base: one resident base model, one arm per adapter.

Run it from the repository root: ``python docs/tutorials/lora_pool.py`` (needs ``pip install hf-metasd[peft]``).
"""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd
from hf_metasd.drafters import LoraDrafter

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


target = tiny_llama(0, layers=2)

# --8<-- [start:adapters]
# One small drafter base: here the target's first layer, embeddings, norm and head copied into a 1-layer model. On it,
# three adapters (in practice: one LoRA fine-tuned per task, e.g. with recipes/pools/train_drafters.py, loaded with
# `peft.PeftModel.from_pretrained` / `load_adapter` or `hf_metasd.drafters.lora.load_adapters(base, {...})`). Here
# they are random (`init_lora_weights=False`), scaled by `lora_alpha` so that they move the base a little or a lot.
base = tiny_llama(1, layers=1)
with torch.no_grad():
    base.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
    base.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    base.model.norm.weight.copy_(target.model.norm.weight)
    base.lm_head.weight.copy_(target.lm_head.weight)


def adapter(alpha: float) -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=alpha, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)


peft_model = get_peft_model(base, adapter(64.0), adapter_name="code")
peft_model.add_adapter("math", adapter(2.0))
peft_model.add_adapter("chat", adapter(256.0))
peft_model.eval()

base_params = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" not in n)
adapter_params = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n) // 3
print(f"one base: {base_params} parameters; each adapter: {adapter_params} parameters")
# --8<-- [end:adapters]

# --8<-- [start:arms]
arms = LoraDrafter.from_peft_model(peft_model)  # one drafter per adapter, sharing the base
print([(arm.name, arm.adapter_name) for arm in arms])
assert all(arm.model is arms[0].model for arm in arms)  # one resident base, not three copies
# --8<-- [end:arms]

# --8<-- [start:generate]
input_ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
reference = target.generate(input_ids, do_sample=False, max_new_tokens=40)

out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=40,
    custom_generate=hf_metasd.generate,
    assistant_models=[peft_model],  # the peft model itself: one arm per adapter, same as `arms`
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)
print(out.metasd.summary())
# The arms switch adapters on the shared base (`set_adapter`) only when the selected arm changes; each arm keeps its
# own KV cache, because the same tokens give different keys and values under different adapters.
# --8<-- [end:generate]

# --8<-- [start:mixed]
# LoRA arms mix freely with other drafters in one pool.
other = tiny_llama(2, layers=1)
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=40,
    custom_generate=hf_metasd.generate,
    assistant_models=[*arms, hf_metasd.ModelDrafter(other, name="small-lm")],
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)
print("pool:", out.metasd.drafter_names, "pulls:", out.metasd.pulls)
# --8<-- [end:mixed]
