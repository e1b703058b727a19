"""Save a drafter pool to a folder, load it back, and push it to the Hub (the push is mocked: no network).

Run it from the repository root: ``python docs/tutorials/pool_hub.py`` (needs ``pip install hf-metasd[peft]``).
"""

import json
import os
import tempfile
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: this script must never reach the network

import torch
from huggingface_hub import HfApi
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

import hf_metasd
from hf_metasd.drafters import EarlyExitDrafter, PromptLookupDrafter
from hf_metasd.pool import DrafterPool

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
    model.generation_config.eos_token_id = None
    return model


target = tiny_llama(0, layers=4)
input_ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
reference = target.generate(input_ids, do_sample=False, max_new_tokens=32)

# --8<-- [start:build]
lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
peft_model = get_peft_model(tiny_llama(1, layers=1), lora, adapter_name="code")
peft_model.add_adapter("math", lora)

pool = DrafterPool(
    [PromptLookupDrafter(), EarlyExitDrafter(target, num_layers=1), peft_model],  # the peft model: one arm per adapter
    target=target,
    policy="ucb",
    policy_kwargs={"beta": 0.5},
    reward="bd",
    num_assistant_tokens=4,
)
print(pool)
# --8<-- [end:build]

# --8<-- [start:generate]
# A pool is what `assistant_models=` takes; it brings its policy, reward and draft length as defaults.
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=32,
    custom_generate=hf_metasd.generate,
    assistant_models=pool,
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)
assert (out.metasd.policy, out.metasd.num_assistant_tokens) == ("ucb", 4)
# --8<-- [end:generate]

with tempfile.TemporaryDirectory() as tmp:
    # --8<-- [start:save]
    # Built in memory, the LoRA base has no Hub id to point to: store its weights inside the pool folder.
    # (Drafters loaded from the Hub are saved as references, a repo id and a revision, unless store_weights=True.)
    folder = Path(tmp) / "my-pool"
    pool.save_pretrained(folder, store_weights=True)
    print(sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()))
    config = json.loads((folder / "config.json").read_text())
    print("config.json:", {k: v for k, v in config.items() if k != "drafters"})
    print("drafters:", [(d["kind"], d["name"], d["stored"]) for d in config["drafters"]])
    card = (folder / "README.md").read_text()
    print(card[card.index("| arm |") : card.index("## Usage")])  # the model card's drafter table
    # --8<-- [end:save]

    # --8<-- [start:load]
    loaded = DrafterPool.from_pretrained(folder, target=target)  # early-exit drafters are rebuilt on this target
    print(loaded)
    again = target.generate(
        input_ids, do_sample=False, max_new_tokens=32, custom_generate=hf_metasd.generate, assistant_models=loaded
    )
    assert torch.equal(again, reference)
    # --8<-- [end:load]

# --8<-- [start:push]
# Pushing is one commit holding config.json, README.md and the stored weights. Here HfApi is mocked, so nothing
# leaves the machine; with a token (`huggingface-cli login`) the same call creates the repo and uploads.
pushed = {}


def fake_create_repo(self, repo_id, **kwargs):
    return SimpleNamespace(repo_id=repo_id)


def fake_upload_folder(self, *, repo_id, folder_path, commit_message, **kwargs):
    files = sorted(str(p.relative_to(folder_path)) for p in Path(folder_path).rglob("*") if p.is_file())
    pushed.update(repo_id=repo_id, files=files, commit_message=commit_message)
    return SimpleNamespace(commit_url=f"https://huggingface.co/{repo_id}/commit/0000000")


with (
    mock.patch.object(HfApi, "create_repo", fake_create_repo),
    mock.patch.object(HfApi, "upload_folder", fake_upload_folder),
):
    commit = pool.push_to_hub("me/tiny-metasd-pool", store_weights=True)

print("one commit:", pushed["commit_message"], "->", commit.commit_url)
print("files:", pushed["files"])
assert {"config.json", "README.md"} <= set(pushed["files"])
# Loading it back is `DrafterPool.from_pretrained("me/tiny-metasd-pool", target=target)`.
# --8<-- [end:push]
