"""Train one small specialised drafter per task for the default target (SmolLM2-135M-Instruct), fully offline.

Design (see /work/shared/MODELS.md for the numbers behind it):

* base drafter: ``LlamaForCausalLM`` with the target's config but ``num_hidden_layers=L``, initialised from the
  target's first ``L`` layers and final norm, sharing the target's (tied, frozen) embedding module; only the
  non-embedding weights are saved (a few MB);
* restricted head: the drafter scores only ``head_token_ids`` (the tokens the target emits in the generated training
  data, plus special tokens); the other logits are ``-inf``. Verification by the target keeps decoding exact;
* one peft LoRA adapter per task on top of a base first trained on all tasks;
* data: the target's own greedy continuations of each task's training prompts (``<data-dir>/train/<task>.jsonl``),
  split into train / val with a fixed seed. The Spec-Bench and HumanEval benchmark prompts are never read.

Run from the repository root::

    python recipes/pools/train_drafters.py --quick      # a few minutes: pipeline check, numbers not meaningful
    python recipes/pools/train_drafters.py              # the real run (timings and results: recipes/pools/train_drafters.md)

Outputs (``--out``, default ``artifacts/smollm2-drafters``): ``base/config.json``, ``base/model.safetensors``,
``head_token_ids.json``, ``adapters/<task>/`` and ``metrics.json``. Generated data are cached in ``--cache``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers import LlamaConfig, LlamaForCausalLM

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from hf_metasd.benchmark.batch import left_pad  # noqa: E402
from hf_metasd.benchmark.offline import chat_prompt, load_default_target  # noqa: E402

TASKS = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag", "code")
EMBEDDING_KEYS = ("model.embed_tokens.weight", "lm_head.weight")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


# ----------------------------------------------------------------------------------------------------------------------
# The two helpers another engineer will move into the library's drafter classes.
# ----------------------------------------------------------------------------------------------------------------------
def build_drafter_base(target, num_layers: int) -> LlamaForCausalLM:
    """A ``num_layers``-layer Llama initialised from the target's first layers and final norm, sharing its embedding."""
    config = LlamaConfig.from_dict(target.config.to_dict())
    config.num_hidden_layers = num_layers
    config.tie_word_embeddings = True
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    drafter = LlamaForCausalLM(config).to(target.dtype)
    state = {k: v for k, v in target.state_dict().items() if k not in EMBEDDING_KEYS}
    state = {
        k: v.clone()
        for k, v in state.items()
        if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers
    }
    _share_embedding(drafter, target)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if [k for k in missing if k not in EMBEDDING_KEYS] or unexpected:
        raise ValueError(f"`target` must be a Llama model, but its weights miss {missing} and add {unexpected}.")
    return drafter.eval()


def _share_embedding(drafter: LlamaForCausalLM, target) -> None:
    embedding = target.get_input_embeddings()
    drafter.model.embed_tokens = embedding  # the same module: no copy
    drafter.lm_head.weight = embedding.weight  # tied, as in the target
    embedding.weight.requires_grad_(False)


def load_drafter_base(target, folder) -> LlamaForCausalLM:
    """Rebuild the saved base drafter around ``target``'s embedding module (shared, not copied).

    ``folder`` holds ``config.json`` and ``model.safetensors`` with only the non-embedding weights.
    """
    folder = Path(folder)
    config = LlamaConfig.from_pretrained(folder)
    if config.hidden_size != target.config.hidden_size or config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"`folder` must hold a drafter for a target with hidden_size={target.config.hidden_size} and "
            f"vocab_size={target.config.vocab_size}, but is {config.hidden_size} / {config.vocab_size}. "
            "Do load the drafter saved for this target."
        )
    drafter = LlamaForCausalLM(config).to(target.dtype)
    _share_embedding(drafter, target)
    state = load_file(folder / "model.safetensors")
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    missing = [k for k in missing if k not in EMBEDDING_KEYS]
    if missing or unexpected:
        raise ValueError(
            f"`folder` must hold every non-embedding weight, but misses {missing}, has extra {unexpected}."
        )
    return drafter.to(target.dtype).eval()


def _head_weight(model, head_token_ids: torch.Tensor) -> torch.Tensor:
    """Rows of the tied embedding for ``head_token_ids``, gathered once and cached until the embedding changes."""
    weight = model.get_input_embeddings().weight
    key = (head_token_ids.data_ptr(), head_token_ids.numel(), weight.data_ptr(), weight._version, weight.dtype)
    cached = getattr(model, "_restricted_head_cache", None)
    if cached is None or cached[0] != key:
        cached = (key, weight.detach()[head_token_ids].contiguous())
        model._restricted_head_cache = cached
    return cached[1]


def restricted_logits(model, hidden_states: torch.Tensor, head_token_ids: torch.Tensor) -> torch.Tensor:
    """Full-vocabulary logits computed only for ``head_token_ids``; every other entry is ``-inf``.

    ``hidden_states`` are the drafter's final-normed hidden states ``(..., d)``; returns ``(..., vocab_size)``.
    """
    small = hidden_states @ _head_weight(model, head_token_ids).T
    full = small.new_full((*small.shape[:-1], model.config.vocab_size), float("-inf"))
    full[..., head_token_ids] = small
    return full


# ----------------------------------------------------------------------------------------------------------------------
# Data: prompts -> the target's greedy continuations (cached) -> train / val
# ----------------------------------------------------------------------------------------------------------------------
def read_prompts(data_dir: Path, task: str) -> list[str]:
    path = data_dir / "train" / f"{task}.jsonl"
    with open(path) as handle:
        return [json.loads(line)["turns"][0] for line in handle if line.strip()]


def shuffled_prompts(
    data_dir: Path, task: str, tokenizer, seed: int, max_prompt_tokens: int
) -> list[tuple[str, list]]:
    """A task's prompts shuffled with `seed`, as (text, chat-template ids), those over `max_prompt_tokens` dropped.

    The first ``--val-prompts`` of this list are the val split (never trained on): the development prompts of every
    recipe (`generate_task_outputs.task_split`).
    """
    prompts = read_prompts(data_dir, task)
    random.Random(seed).shuffle(prompts)
    pairs = [(text, chat_prompt(tokenizer, text)[0].tolist()) for text in prompts]
    return [(text, ids) for text, ids in pairs if len(ids) <= max_prompt_tokens]


@torch.no_grad()
def generate_continuations(target, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int, eos: int, desc):
    """Greedy continuations, batched with left padding; each stops at (and includes) the first eos."""
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    for start in tqdm(range(0, len(order), batch_size), desc=desc, leave=False):
        idx = order[start : start + batch_size]
        ids, mask = left_pad([torch.tensor([prompt_ids[i]], dtype=torch.long) for i in idx], eos)
        width = ids.shape[1]
        out = target.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=eos,
            eos_token_id=eos,
        )[:, width:]
        for row, i in enumerate(idx):
            tokens = out[row].tolist()
            outputs[i] = tokens[: tokens.index(eos) + 1] if eos in tokens else tokens
    return outputs


@torch.no_grad()
def target_greedy_labels(target, examples: list[dict], batch_size: int = 4) -> None:
    """Teacher-forced greedy token of ``target`` at every continuation position, stored as ``ex['label']``."""
    for batch in _batches(examples, batch_size, shuffle=False):
        ids, mask, _ = _collate(batch, key=None)
        hidden = target.model(input_ids=ids, attention_mask=mask).last_hidden_state
        for row, ex in enumerate(batch):
            p, n = len(ex["prompt"]), len(ex["output"])
            ex["label"] = target.lm_head(hidden[row, p - 1 : p - 1 + n]).argmax(-1).tolist()


def build_task_data(args, task: str, target_gen, target_ref, tokenizer) -> dict:
    """Prompts of one task -> {'train': [...], 'val': [...]} of {'prompt', 'output', 'label'?} token lists.

    Prompts are shuffled with ``--seed``; the first ``--val-prompts`` form val, the next ones train. Continuations
    are cached per prompt in ``--cache``, so a larger ``--max-prompts-per-task`` generates only the new prompts and
    keeps the same val set.
    """
    cache = args.cache / f"{task}_new{args.max_new_tokens}_seed{args.seed}_maxlen{args.max_prompt_tokens}.pt"
    store = torch.load(cache) if cache.is_file() else {"items": [], "gen_seconds": 0.0}
    pairs = shuffled_prompts(args.data_dir, task, tokenizer, args.seed, args.max_prompt_tokens)
    ids = [x for _, x in pairs][: args.max_prompts_per_task]
    n_val = min(args.val_prompts, len(ids) // 2)
    new = ids[len(store["items"]) :]
    if new:
        t0 = time.time()
        outputs = generate_continuations(
            target_gen, new, args.max_new_tokens, args.gen_batch_size, tokenizer.eos_token_id, desc=f"generate {task}"
        )
        store["items"] += [{"prompt": p, "output": o} for p, o in zip(new, outputs)]
        store["gen_seconds"] += time.time() - t0
    items = [e for e in store["items"][: len(ids)] if e["output"]]
    unlabelled = [e for e in items[:n_val] if "label" not in e]
    if unlabelled:
        target_greedy_labels(target_ref, unlabelled)  # exact fp32 reference labels for val alpha
    if new or unlabelled:
        torch.save(store, cache)
    return {"train": items[n_val:], "val": items[:n_val], "gen_seconds": store["gen_seconds"]}


# ----------------------------------------------------------------------------------------------------------------------
# Training and measurement
# ----------------------------------------------------------------------------------------------------------------------
def _batches(examples, batch_size, shuffle, rng=None):
    order = list(range(len(examples)))
    if shuffle:
        rng.shuffle(order)
        # group by length inside windows of 8 batches so padding stays small
        window = batch_size * 8
        order = [
            i
            for w in range(0, len(order), window)
            for i in sorted(
                order[w : w + window], key=lambda j: len(examples[j]["prompt"]) + len(examples[j]["output"])
            )
        ]
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        rng.shuffle(chunks)
    else:
        order.sort(key=lambda j: len(examples[j]["prompt"]) + len(examples[j]["output"]))
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    for chunk in chunks:
        yield [examples[i] for i in chunk]


def _collate(batch, key: str | None, head_index: torch.Tensor | None = None, context: int | None = None):
    """Right-padded ids, mask, and (if ``key``) labels at continuation positions (-100 elsewhere).

    ``context`` keeps only the last ``context`` prompt tokens (training only: RoPE is relative, so a 2-layer drafter
    loses little, and long summarization / RAG prompts stop dominating the training cost).
    """
    if context is not None:
        batch = [{**e, "prompt": e["prompt"][-context:]} for e in batch]
    width = max(len(e["prompt"]) + len(e["output"]) for e in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for row, e in enumerate(batch):
        seq = e["prompt"] + e["output"]
        ids[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
        if key is not None:
            p, target_tokens = len(e["prompt"]), torch.tensor(e[key])
            labels[row, p - 1 : p - 1 + len(target_tokens)] = (
                head_index[target_tokens] if head_index is not None else target_tokens
            )
    return ids, mask, labels


def _hidden(model: LlamaForCausalLM, ids, mask):
    return model.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def train(
    model, params, examples, head_ids, head_index, epochs, lr, batch_size, seed, desc, context=None
) -> list[float]:
    """Cross-entropy over the restricted head on the target's greedy tokens; returns mean loss per epoch."""
    rng = random.Random(seed)
    optim = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    steps = epochs * math.ceil(len(examples) / batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min(1.0, (s + 1) / max(1, steps // 20)) * max(0.0, 1 - s / steps)
    )
    model.train()
    losses = []
    bar = tqdm(total=steps, desc=desc, leave=False)
    for _ in range(epochs):
        total, count = 0.0, 0
        for batch in _batches(examples, batch_size, shuffle=True, rng=rng):
            ids, mask, labels = _collate(batch, key="output", head_index=head_index, context=context)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hidden = _hidden(model, ids, mask)
            sel = labels != -100
            logits = hidden[sel].float() @ _head_weight(model, head_ids).float().T
            loss = F.cross_entropy(logits, labels[sel])
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optim.step()
            sched.step()
            total, count = total + loss.item() * int(sel.sum()), count + int(sel.sum())
            bar.update()
            bar.set_postfix(loss=f"{loss.item():.3f}")
        losses.append(total / max(1, count))
    bar.close()
    model.eval()
    return losses


@torch.no_grad()
def alpha(model, examples, head_ids, batch_size: int = 8) -> float:
    """Fraction of val positions where the drafter's greedy token equals the target's (teacher-forced)."""
    hits, count = 0, 0
    for batch in _batches(examples, batch_size, shuffle=False):
        ids, mask, labels = _collate(batch, key="label")
        hidden = _hidden(model, ids, mask)
        sel = labels != -100
        pred = head_ids[(hidden[sel] @ _head_weight(model, head_ids).T).argmax(-1)]
        hits, count = hits + int((pred == labels[sel]).sum()), count + int(sel.sum())
    return hits / max(1, count)


@torch.no_grad()
def ms_per_token(steps: dict, prompt_len: int = 64, warmup: int = 5, calls: int = 30) -> dict:
    """Median ms of one cached single-token step after a ``prompt_len`` prefill, for each ``step`` in ``steps``.

    ``step(ids, cache) -> (token, cache)``. The steps are interleaved call by call and the median is taken, so load
    from other processes on a shared CPU hits every model alike.
    """
    torch.manual_seed(0)
    ids = torch.randint(100, 10000, (1, prompt_len))
    state = {name: step(ids, None) for name, step in steps.items()}
    times = {name: [] for name in steps}
    for call in range(warmup + calls):
        for name, step in steps.items():
            start = time.perf_counter()
            state[name] = step(*state[name])
            if call >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: sorted(t)[len(t) // 2] * 1000 for name, t in times.items()}


def target_step(target):
    def step(ids, cache):
        out = target(input_ids=ids, past_key_values=cache, use_cache=True)
        return out.logits[:, -1:].argmax(-1), out.past_key_values

    return step


def drafter_step(model, head_ids):
    def step(ids, cache):
        out = model.model(input_ids=ids, past_key_values=cache, use_cache=True)
        return restricted_logits(model, out.last_hidden_state[:, -1:], head_ids).argmax(-1), out.past_key_values

    return step


def measure_costs(args, target, target_bf16, head_ids):
    """ms per token of the targets and of the saved drafters (fp32 / bf16), and the cost ratios c."""
    from peft import PeftModel

    steps = {}
    for name, tgt in (("fp32", target), ("bf16", target_bf16)):
        steps[f"target_{name}_ms"] = target_step(tgt)
        base = load_drafter_base(tgt, args.out / "base")
        if base.model.embed_tokens is not tgt.get_input_embeddings():
            raise RuntimeError("load_drafter_base must share the target's embedding module.")
        steps[f"drafter_{name}_base_ms"] = drafter_step(base, head_ids)
        full = load_drafter_base(tgt, args.out / "base")
        steps[f"drafter_{name}_fullhead_ms"] = drafter_step(full, torch.arange(tgt.config.vocab_size))
        tasks = args.tasks if name == "bf16" else args.tasks[:1]
        for task in tasks:
            lora = load_drafter_base(tgt, args.out / "base")
            PeftModel.from_pretrained(lora, args.out / "adapters" / task, adapter_name=task)
            if task == args.tasks[0]:
                steps[f"drafter_{name}_lora_ms"] = drafter_step(lora, head_ids)
            merged = load_drafter_base(tgt, args.out / "base")
            PeftModel.from_pretrained(merged, args.out / "adapters" / task, adapter_name=task).merge_and_unload()
            steps[f"drafter_{name}_merged_{task}_ms"] = drafter_step(merged, head_ids)
    costs = ms_per_token(steps)
    c = {}
    for task in args.tasks:
        ms = costs[f"drafter_bf16_merged_{task}_ms"]
        c[f"{task}_bf16_vs_target_fp32"] = ms / costs["target_fp32_ms"]
        c[f"{task}_bf16_vs_target_bf16"] = ms / costs["target_bf16_ms"]
    task = args.tasks[0]
    c[f"{task}_bf16_unmerged_lora_vs_target_bf16"] = costs["drafter_bf16_lora_ms"] / costs["target_bf16_ms"]
    c[f"{task}_fp32_vs_target_fp32"] = costs[f"drafter_fp32_merged_{task}_ms"] / costs["target_fp32_ms"]
    return costs, c


def predicted_speedup(a: float, c: float, k: int = 4, verify_cost: float = 1.4) -> float:
    """Expected tokens per round over its cost in target steps (i.i.d. acceptance; MODELS.md verify cost)."""
    expected = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1
    return expected / (k * c + verify_cost)


# ----------------------------------------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="tiny run (a few minutes) that checks the whole pipeline")
    p.add_argument("--data-dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "artifacts" / "smollm2-drafters")
    p.add_argument("--cache", type=Path, default=REPO_ROOT / "artifacts" / "distill-cache")
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--num-layers", type=int, default=2, help="drafter depth L (initialised from the target's first L)")
    p.add_argument("--max-prompts-per-task", type=int, default=128)
    p.add_argument("--max-prompt-tokens", type=int, default=768)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--val-prompts", type=int, default=10, help="held-out prompts per task (the first after shuffling)")
    p.add_argument("--gen-batch-size", type=int, default=20)
    p.add_argument("--base-epochs", type=int, default=6)
    p.add_argument("--base-lr", type=float, default=1e-3)
    p.add_argument("--adapter-epochs", type=int, default=4)
    p.add_argument("--adapter-lr", type=float, default=1e-3)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--train-context", type=int, default=192, help="prompt tokens kept per training sequence")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--measure-only", action="store_true", help="re-measure costs of the drafters saved in --out")
    args = p.parse_args(argv)
    if args.quick:
        args.max_prompts_per_task, args.max_new_tokens = (
            min(args.max_prompts_per_task, 24),
            min(args.max_new_tokens, 32),
        )
        args.base_epochs, args.adapter_epochs = 1, 1
        args.val_prompts = min(args.val_prompts, 6)
        args.cache = args.cache.with_name(args.cache.name + "-quick")
        if args.out == REPO_ROOT / "artifacts" / "smollm2-drafters":
            args.out = args.out.with_name("smollm2-drafters-quick")
    return args


def main(argv=None) -> dict:
    from peft import LoraConfig, get_peft_model

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    args.cache.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    clock = {"start": time.time()}
    timings = {}

    target, tokenizer = load_default_target(torch.float32)
    target_bf16, _ = load_default_target(torch.bfloat16)
    for m in (target, target_bf16):
        m.requires_grad_(False)
    if args.measure_only:
        metrics = json.loads((args.out / "metrics.json").read_text())
        head_ids = torch.tensor(json.loads((args.out / "head_token_ids.json").read_text()))
        metrics["cost_ms"], metrics["cost_ratio"] = measure_costs(args, target, target_bf16, head_ids)
        metrics["predicted_speedup_k4_bf16"] = {
            t: predicted_speedup(metrics["alpha"][t][t], metrics["cost_ratio"][f"{t}_bf16_vs_target_bf16"])
            for t in args.tasks
        }
        (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        print_report(metrics, args.tasks)
        return metrics

    # 1. distillation data
    data = {}
    for task in tqdm(args.tasks, desc="distillation data"):
        data[task] = build_task_data(args, task, target_bf16, target, tokenizer)
    timings["data_s"] = time.time() - clock["start"]
    all_train = [e for t in args.tasks for e in data[t]["train"]]

    # 2. restricted head: tokens the target emits on the training split, plus special tokens
    emitted = {tok for e in all_train for tok in e["output"]}
    emitted |= set(tokenizer.all_special_ids) | {tokenizer.eos_token_id}
    head_ids = torch.tensor(sorted(emitted), dtype=torch.long)
    head_index = torch.full((target.config.vocab_size,), -100, dtype=torch.long)
    head_index[head_ids] = torch.arange(len(head_ids))
    (args.out / "head_token_ids.json").write_text(json.dumps(head_ids.tolist()))
    val_tokens = [tok for t in args.tasks for e in data[t]["val"] for tok in e["label"]]
    head_coverage = sum(int(head_index[t] >= 0) for t in val_tokens) / max(1, len(val_tokens))
    label_match = [
        sum(int(a == b) for e in data[t]["val"] for a, b in zip(e["output"], e["label"]))
        / max(1, sum(len(e["label"]) for e in data[t]["val"]))
        for t in args.tasks
    ]

    # 3. base: untrained alpha, then train on all tasks
    drafter = build_drafter_base(target, args.num_layers)
    rows = {}
    rows["untrained"] = {t: alpha(drafter, data[t]["val"], head_ids) for t in tqdm(args.tasks, desc="alpha untrained")}
    t0 = time.time()
    base_params = [p for n, p in drafter.named_parameters() if "embed_tokens" not in n and "lm_head" not in n]
    for p in base_params:
        p.requires_grad_(True)
    base_losses = train(
        drafter,
        base_params,
        all_train,
        head_ids,
        head_index,
        args.base_epochs,
        args.base_lr,
        args.batch_size,
        args.seed,
        desc=f"train shared base ({len(all_train)} seqs)",
        context=args.train_context,
    )
    timings["base_train_s"] = time.time() - t0
    drafter.requires_grad_(False)
    with torch.no_grad():  # the base is shipped in bf16 (the drafting dtype): round it now so adapters see that base
        for p in base_params:
            p.copy_(p.to(torch.bfloat16).float())
    rows["shared_base"] = {t: alpha(drafter, data[t]["val"], head_ids) for t in tqdm(args.tasks, desc="alpha base")}
    (args.out / "base").mkdir(exist_ok=True)
    drafter.config.save_pretrained(args.out / "base")
    base_state = {
        k: v.to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items() if k not in EMBEDDING_KEYS
    }
    save_file(base_state, args.out / "base" / "model.safetensors", metadata={"format": "pt"})

    # 4. one LoRA adapter per task
    lora = LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r, lora_dropout=0.05, target_modules=LORA_TARGETS)
    peft_model = None
    adapter_losses = {}
    t0 = time.time()
    for task in args.tasks:
        if peft_model is None:
            peft_model = get_peft_model(drafter, lora, adapter_name=task)
        else:
            peft_model.add_adapter(task, lora)
        peft_model.set_adapter(task)
        params = [p for n, p in drafter.named_parameters() if f"lora_A.{task}." in n or f"lora_B.{task}." in n]
        for p in params:
            p.requires_grad_(True)
        adapter_losses[task] = train(
            drafter,
            params,
            data[task]["train"],
            head_ids,
            head_index,
            args.adapter_epochs,
            args.adapter_lr,
            args.batch_size,
            args.seed,
            desc=f"adapter {task} ({len(data[task]['train'])} seqs)",
            context=args.train_context,
        )
        for p in params:
            p.requires_grad_(False)
        peft_model.save_pretrained(args.out / "adapters", selected_adapters=[task])
    timings["adapters_train_s"] = time.time() - t0
    for task in tqdm(args.tasks, desc="alpha matrix"):
        peft_model.set_adapter(task)
        rows[task] = {t: alpha(drafter, data[t]["val"], head_ids) for t in args.tasks}

    # 5. cost: rebuilt from the saved artefacts around each target dtype
    costs, c = measure_costs(args, target, target_bf16, head_ids)

    size_mb = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file() and f.name != "metrics.json") / 2**20
    c_bf16 = {t: c[f"{t}_bf16_vs_target_bf16"] for t in args.tasks}
    metrics = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "num_layers": args.num_layers,
        "head_size": len(head_ids),
        "head_coverage_val": head_coverage,
        "val_label_match_bf16_generation_vs_fp32_argmax": dict(zip(args.tasks, label_match)),
        "data": {
            t: {
                "train_seqs": len(data[t]["train"]),
                "val_seqs": len(data[t]["val"]),
                "train_tokens": sum(len(e["output"]) for e in data[t]["train"]),
                "val_tokens": sum(len(e["label"]) for e in data[t]["val"]),
                "gen_seconds": data[t]["gen_seconds"],
            }
            for t in args.tasks
        },
        "alpha": rows,
        "cost_ms": costs,
        "cost_ratio": c,
        "predicted_speedup_k4_bf16": {t: predicted_speedup(rows[t][t], c_bf16[t]) for t in args.tasks},
        "losses": {"shared_base": base_losses, **adapter_losses},
        "timings_s": {**timings, "total_s": time.time() - clock["start"]},
        "artefacts_mb": size_mb,
    }
    (args.out / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    print_report(metrics, args.tasks)
    return metrics


def print_report(m: dict, tasks) -> None:
    short = {
        "mt_bench": "mt_bench",
        "translation": "transl",
        "summarization": "summ",
        "qa": "qa",
        "math_reasoning": "math",
        "rag": "rag",
        "code": "code",
    }
    print(f"\nL={m['num_layers']}  head={m['head_size']} tokens  val head coverage={m['head_coverage_val']:.3f}")
    print("\ncost (ms per token, cached, 64-token prompt, 2 threads)")
    for k, v in m["cost_ms"].items():
        print(f"  {k:38s} {v:7.2f}")
    print("cost ratio c")
    for k, v in m["cost_ratio"].items():
        print(f"  {k:38s} {v:7.3f}")
    print("\nalpha (rows: drafter, columns: val task; teacher-forced top-1 agreement with the fp32 target)")
    print(f"  {'drafter':15s}" + "".join(f"{short[t]:>9s}" for t in tasks))
    for row, vals in m["alpha"].items():
        print(f"  {row:15s}" + "".join(f"{vals[t]:9.3f}" for t in tasks))
    print("\npredicted speedup (k=4, verify=1.4 target steps, bf16, diagonal alpha)")
    print("  " + "  ".join(f"{short[t]}={v:.2f}x" for t, v in m["predicted_speedup_k4_bf16"].items()))
    print("\ndata (train seqs / tokens, val seqs / tokens, generation s)")
    for t, d in m["data"].items():
        print(
            f"  {t:15s} {d['train_seqs']:5d} {d['train_tokens']:7d}  {d['val_seqs']:4d} {d['val_tokens']:6d}  {d['gen_seconds']:6.0f}"
        )
    print("\ntimings (s): " + ", ".join(f"{k}={v:.0f}" for k, v in m["timings_s"].items()))
    print(f"artefacts folder: {m['artefacts_mb']:.2f} MB")


if __name__ == "__main__":
    main()
