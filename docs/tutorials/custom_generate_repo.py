"""Write hf_metasd as a transformers ``custom_generate`` repository and generate through it from a local folder.

Run it from the repository root: ``python docs/tutorials/custom_generate_repo.py``.
"""

import os
import shutil
import tempfile
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # belt and braces: this script must never reach the network
os.environ["HF_MODULES_CACHE"] = tempfile.mkdtemp()  # where transformers copies a repository's code (removed below)

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hf_metasd.custom_generate_repo import write_custom_generate_repo
from hf_metasd.drafters import PromptLookupDrafter
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


workdir = Path(tempfile.mkdtemp())
target = tiny_llama(0, layers=4)
drafters = [tiny_llama(1, layers=1), tiny_llama(2, layers=1)]
input_ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79]])
reference = target.generate(input_ids, do_sample=False, max_new_tokens=32)

# --8<-- [start:write]
# The same as `hf-metasd custom-generate-repo metasd_repo` on the command line.
folder = write_custom_generate_repo(workdir / "metasd_repo")
print(sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()))
print((folder / "custom_generate" / "requirements.txt").read_text())
# --8<-- [end:write]

# --8<-- [start:generate]
out = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=32,
    custom_generate=str(folder),  # a folder, or the Hub id of a repository pushed from it
    trust_remote_code=True,  # transformers runs the folder's custom_generate/generate.py
    assistant_models=drafters,
    return_dict_in_generate=True,
)
assert torch.equal(out.sequences, reference)  # lossless: the target's own greedy output
print(out.metasd.summary())
# --8<-- [end:generate]

# --8<-- [start:pool]
pool = DrafterPool([*drafters, PromptLookupDrafter()], target=target, policy="ucb", num_assistant_tokens=4)
again = target.generate(
    input_ids,
    do_sample=False,
    max_new_tokens=32,
    custom_generate=str(folder),
    trust_remote_code=True,
    assistant_models=pool,
)
assert torch.equal(again, reference)
# --8<-- [end:pool]

# --8<-- [start:refused]
try:
    target.generate(
        input_ids, max_new_tokens=8, custom_generate=str(folder), assistant_models=drafters, trust_remote_code=False
    )
except ValueError as err:
    print("refused:", str(err).splitlines()[-1])
else:
    raise AssertionError("transformers must refuse to run a repository's code without trust_remote_code=True")
# --8<-- [end:refused]

shutil.rmtree(workdir)
shutil.rmtree(os.environ["HF_MODULES_CACHE"])
