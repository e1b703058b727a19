"""Train an EAGLE-3-style feature head (`hf_metasd.feature_head`) for a target from the target's own answers.

Input: the task-output stores of `recipes/pools/generate_task_outputs.py` (``<stores>/<task>.pt``, each holding
``{"prompts": [[ids]], "outputs": [[ids]], ...}``: the target's greedy answers to training prompts; the dev prompts
were never answered there, and benchmark prompts are never read). Per task, the first ``--val-sequences`` stored
sequences are **held-out training sequences** (the only data choices are made on); the rest are trained on. The
stores of ``--train-only-tasks`` (text that is not the target's own, e.g. ``sharegpt``) hold none out. A store
may also hold ``"answer_spans"``: per sequence, the ``[start, end)`` token ranges of prompt + output whose tokens are
answers (`recipes/pools/sharegpt_data.py` marks every assistant turn of a conversation so): the positions that predict
those tokens are the scored ones; without it, every position from the last prompt token on is.

1. **Features, once.** Each prompt + answer sequence goes through one target forward pass inside a `FeatureRecorder`
   (pre-hooks on ``--layer-ids``; no ``output_hidden_states``); the features ``f`` and the target's greedy next
   token at every position (the labels) are written to chunked safetensors under ``--work-dir``
   (``train-NNNNN.safetensors``, ``val-NNNNN.safetensors``, then ``features.json``), reused while the settings match,
   so epochs never rerun the target.
2. **Draft vocabulary.** The ``--draft-vocab-size`` target tokens most often predicted on the training answers
   (ties by id), as ``d2t`` / ``t2d`` (`hf_metasd.feature_head.vocab_map`).
3. **Training-time test** (EAGLE-3), over whole sequences at once. Entry ``c`` of a sequence ``x_0 .. x_{N-1}``
   pairs the feature ``f_c`` with the token ``x_{c+1}``. Step 0 reads ``fc(f_c)``; step ``s >= 1`` reads the head's
   own step ``s - 1`` output ``o_c`` with the token ``x_{c+1+s}`` at rotary position ``c + 1 + s``, and attends to
   the step-0 entries ``0 .. c`` and to its own row's entries of steps ``1 .. s``: exactly the cache `FeatureHead.draft`
   holds when it drafts ``s`` tokens after committing entries ``0 .. c`` (`unrolled_logits`; a test checks it against
   the head's cached passes). Step ``s`` of entry ``c`` is scored against the target's greedy token at position
   ``c + 1 + s`` on answer positions only (the scored positions above), weighted by ``0.8 ** s``: the
   cross-entropy over the draft vocabulary (labels outside it are skipped). AdamW (``--betas``; float32 weights,
   the passes under ``--autocast bfloat16`` where the CPU has bfloat16 matrix units), gradient clipping
   (``--clip``), ``--lr`` after ``--warmup`` linear steps, then constant or ``--schedule cosine`` (`lr_factor`).
   Batches: ``--shuffle chunk`` (the chunks in random order, shuffled within each; as the cache is written task by
   task, most batches hold one task) or ``global`` (every training sequence in one random order).
   ``--lm-head target`` / ``target-frozen`` starts the LM head from the target's LM head rows of the draft vocabulary
   (fine-tuned / frozen), as speculators does. Two more options were measured and removed (docs/benchmarks.md,
   "Feature-head recipe ablation"): a KL loss against the target's cached top-k distribution (level with the
   cross-entropy, 20 % slower) and one RMSNorm per fused layer before ``fc`` (worse).
4. **Reports** per epoch: train loss, the held-out cross-entropy (``val_loss``), and per
   step the top-1 agreement with the target's greedy token, full (``agreement_step<s>``: teacher-forced with the
   stored tokens at every scored entry) and conditional (``conditional_step<s>``: only entries whose steps ``< s``
   were all right, as speculators reports it: the acceptance of draft token ``s + 1`` given the ones before;
   `step_counts`), with standard errors over held-out sequences (labels outside the draft vocabulary count as
   misses), tokens/s and wall time; the untrained head first. The head is saved with `save_head` to ``--out``
   (hf_metasd's layout), the run's record to ``<out>/training_record.json``.
5. **Per-task adapters** (``--lora-task TASK``, repeatable, with ``--base-head DIR``, a trained head): the head is
   loaded and frozen, and for each task a LoRA adapter (`hf_metasd.feature_head.add_adapter`: rank ``--lora-rank`` on
   the decoder layer's projections) is trained with the same training-time-test loss on that task's training
   sequences only (the cache records the task of every sequence: ``sequence_tasks`` in `features.json`'s settings).
   Reports the held-out agreement on that task's held-out sequences for the base head and the adapted head, and
   their paired difference (`paired_difference`); an adapter is **kept** only where its step-0 gain exceeds
   ``KEEP_STANDARD_ERRORS`` (2) standard errors of that difference, beyond the validation noise. Saves the base head
   and ``adapters/<task>/`` of the kept tasks to ``--out`` (default ``artifacts/feature-head-adapters``), the layout
   a pool stores a head with adapter arms in; the record holds every task's figures and ``kept``. A pool from it:
   ``head = load_feature_head(out, target)``, then ``load_adapter(head, out / "adapters" / task, task)`` per kept
   task and ``FeatureHeadDrafter.arms(head)`` (the base head and one arm per adapter; or `pool_with_head.py`). The
   features must be cached with the base head's layers (the same ``--work-dir``, ``--tasks`` and sequence settings as
   the head's run reuse its cache).

Run from the repository root::

    python recipes/pools/train_feature_head.py --stores artifacts/task-outputs --out artifacts/feature-head
    python recipes/pools/train_feature_head.py --max-sequences 8 --val-sequences 2 --epochs 1 --threads 1  # smoke
    python recipes/pools/train_feature_head.py --base-head artifacts/feature-head --lora-task code --lora-task rag

The smoke run (SmolLM2-135M, 7 tasks x 8 sequences, ``--draft-vocab-size 4096``, 1 thread beside a running
generate_task_outputs.py on 2 cores) took 84 s: the target pass ~420 tokens/s, training ~370 tokens/s.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))  # run as a script: recipes import each other as `recipes.<group>.<name>`

from hf_metasd.feature_head import (  # noqa: E402
    FeatureHead,
    FeatureHeadConfig,
    FeatureRecorder,
    add_adapter,
    load_feature_head,
    round_to_bfloat16,
    save_adapter,
    save_head,
    set_active_adapter,
)
from recipes.pools.train_drafters import TASKS  # noqa: E402

FEATURES_META = "features.json"
RECORD_NAME = "training_record.json"
STEP_WEIGHT = 0.8
KEEP_STANDARD_ERRORS = 2.0  # an adapter is kept when its paired step-0 gain over the base head exceeds this many
# standard errors on its task's held-out sequences (`paired_difference`; 2: about one chance in 40 that a useless
# adapter passes)


# ======================================================================================================================
# data: the stores, and the features cached from one target pass per sequence
# ======================================================================================================================
def read_stores(stores: Path, tasks, max_sequences: int | None, val_sequences: int, train_only=()) -> dict[str, list]:
    """``{"train": [...], "val": [...]}`` of `StoredSequence` ``(task, prompt ids, answer ids)``: per task, the first
    `val_sequences` of its first `max_sequences` stored sequences are held out (none of a task in `train_only`: text
    that is not the target's own, such as ShareGPT's, is trained on and never measured on)."""
    paths = [stores / f"{task}.pt" for task in tasks if (stores / f"{task}.pt").is_file()]
    if not paths:
        raise SystemExit(
            f"`--stores` must hold <task>.pt files written by generate_task_outputs.py for {list(tasks)}, but "
            f"{str(stores)!r} holds none. Pass the `--out` of generate_task_outputs.py."
        )
    split: dict[str, list] = {"train": [], "val": []}
    for path in paths:
        store = torch.load(path)
        spans = store.get("answer_spans") or [None] * len(store["outputs"])
        rows = list(zip(store["prompts"], store["outputs"], spans, strict=True))[:max_sequences]
        for i, (prompt, answer, answer_spans) in enumerate(rows):
            spans_ok = check_spans(answer_spans, len(prompt) + len(answer), path, i)
            row = StoredSequence(path.stem, list(prompt), list(answer), spans_ok)
            split["val" if i < val_sequences and path.stem not in train_only else "train"].append(row)
    if not split["train"]:
        raise SystemExit(
            f"`--val-sequences` must leave sequences to train on, but is {val_sequences} with stores of at most "
            f"{max(len(torch.load(p)['outputs']) for p in paths)} sequences (`--max-sequences` {max_sequences}). "
            "Lower it, or generate more answers."
        )
    return split


class StoredSequence(tuple):
    """``(task, prompt ids, answer ids)``, and the store's ``answer_spans`` of the sequence as `spans` (None: the
    store has none)."""

    def __new__(cls, task: str, prompt: list, answer: list, spans: list | None = None):
        row = super().__new__(cls, (task, prompt, answer))
        row.spans = spans
        return row


def check_spans(spans, length: int, path: Path, index: int) -> list[list[int]] | None:
    """`spans` as ``[[start, end], ...]``: increasing, disjoint, inside ``1 .. length``."""
    if spans is None:
        return None
    spans = [[int(a), int(b)] for a, b in spans]
    bounds = [x for span in spans for x in span]
    if not spans or bounds != sorted(bounds) or bounds[0] < 1 or bounds[-1] > length or any(a >= b for a, b in spans):
        raise SystemExit(
            f"`answer_spans` must be increasing, disjoint [start, end) ranges inside 1 .. {length} (prompt + output), "
            f"but sequence {index} of {path} has {spans}. Rebuild the store."
        )
    return spans


def scored_positions(length: int, prompt_length: int, spans: list | None) -> torch.Tensor:
    """Which of a sequence's positions are scored, ``(length,)`` bool: position ``j`` predicts token ``j + 1``; with
    `spans`, those predicting a token of a span; without, every position from the last prompt token on."""
    scored = torch.zeros(length, dtype=torch.bool)
    if spans is None:
        scored[max(prompt_length - 1, 0) :] = True
    for start, end in spans or []:
        scored[start - 1 : end - 1] = True
    return scored


@torch.no_grad()
def write_features(target, sequences: list, layer_ids, folder: Path, split: str, chunk: int, dtype, desc: str):
    """One target pass per sequence; chunks of `chunk` sequences as ``<split>-NNNNN.safetensors`` holding the
    concatenated ``features`` (sum N, k H), ``input_ids`` and ``labels`` (the target's greedy next token, sum N),
    ``lengths``, ``prompt_lengths`` and ``scored`` (`scored_positions`, sum N). Returns ``(tokens, seconds,
    agreement of the stored answers with the labels)``.
    """
    tokens, seconds, same, answered = 0, 0.0, 0, 0
    names = ("features", "input_ids", "labels", "lengths", "prompt_lengths", "scored")
    rows: dict[str, list] = {k: [] for k in names}
    for i, sequence in enumerate(tqdm(sequences, desc=desc, leave=False)):
        (_, prompt, answer), spans = sequence, getattr(sequence, "spans", None)
        ids = torch.tensor([prompt + answer])
        start = time.perf_counter()
        with FeatureRecorder(target, layer_ids) as recorder:
            logits = target(ids).logits
        seconds += time.perf_counter() - start
        labels = logits[0].argmax(-1)
        tokens += ids.shape[1]
        scored = scored_positions(ids.shape[1], len(prompt), spans)
        same += int((labels[:-1] == ids[0, 1:])[scored[:-1]].sum())
        answered += int(scored[:-1].sum())
        rows["features"].append(recorder.features()[0].to(dtype))
        rows["input_ids"].append(ids[0])
        rows["labels"].append(labels)
        rows["lengths"].append(ids.shape[1])
        rows["prompt_lengths"].append(len(prompt))
        rows["scored"].append(scored)
        if len(rows["lengths"]) == chunk or i == len(sequences) - 1:
            tensors = {
                k: torch.tensor(v) if k in ("lengths", "prompt_lengths") else torch.cat(v) for k, v in rows.items()
            }
            save_file(
                {k: v.contiguous() for k, v in tensors.items()}, str(folder / f"{split}-{i // chunk:05d}.safetensors")
            )
            rows = {k: [] for k in rows}
    return tokens, seconds, same / max(answered, 1)


def cache_features(target, args, split: dict[str, list], layer_ids) -> dict:
    """The features of both splits under ``--work-dir``, computed unless `features.json` says they already are for
    these settings. Returns that metadata."""
    folder = args.work_dir
    settings = {
        "target": getattr(target.config, "_name_or_path", ""),
        "stores": str(args.stores.resolve()),
        "tasks": sorted({task for rows in split.values() for task, _, _ in rows}),
        "layer_ids": list(layer_ids),
        "feature_dtype": args.feature_dtype,
        "max_sequences": args.max_sequences,
        "val_sequences": args.val_sequences,
        "sequences": {name: len(rows) for name, rows in split.items()},
        "chunk_sequences": args.chunk_sequences,
        "sequence_tasks": {name: task_runs(rows) for name, rows in split.items()},
    }
    if args.train_only_tasks:  # (absent: the settings of older caches)
        settings["train_only_tasks"] = sorted(args.train_only_tasks)
    if any(
        getattr(row, "spans", None) is not None for rows in split.values() for row in rows
    ):  # (absent: the settings of older caches)
        settings["answer_spans"] = True
    meta_path = folder / FEATURES_META
    if meta_path.is_file():
        meta = json.loads(meta_path.read_text())
        meta["settings"].pop("target_top_k", None)  # caches that also hold the removed KL loss's top-k: reusable
        if meta["settings"] == settings:
            print(f"features: reusing {folder}", flush=True)
            return meta
        older = {k: v for k, v in settings.items() if k != "sequence_tasks"}
        if meta["settings"] == older and cached_in_order(folder, split):  # written before the tasks were recorded
            meta["settings"] = settings
            meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
            print(f"features: reusing {folder} (the task of each sequence now recorded)", flush=True)
            return meta
        print(f"features: settings changed, recomputing {folder}", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    for old in folder.glob("*-*.safetensors"):
        old.unlink()
    meta = {"settings": settings}
    for name, rows in split.items():
        tokens, seconds, agreement = write_features(
            target,
            rows,
            layer_ids,
            folder,
            name,
            args.chunk_sequences,
            getattr(torch, args.feature_dtype),
            name,
        )
        meta[name] = {"tokens": tokens, "seconds": seconds, "answers_match_labels": agreement}
        print(
            f"features {name}: {len(rows)} sequences, {tokens} tokens, {tokens / max(seconds, 1e-9):.0f} tokens/s "
            f"(target pass), stored answers = recomputed greedy on {agreement:.1%} of answer tokens",
            flush=True,
        )
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True))
    return meta


def task_runs(rows: list) -> list[list]:
    """The tasks of `rows` (``(task, prompt, answer)``, in cache order) as runs ``[[task, count], ...]``."""
    runs: list[list] = []
    for task, _, _ in rows:
        if runs and runs[-1][0] == task:
            runs[-1][1] += 1
        else:
            runs.append([task, 1])
    return runs


def cached_in_order(folder: Path, split: dict[str, list]) -> bool:
    """Whether the cached sequences of each split are `split`'s, in order (their token ids, read without the
    features): then `split` gives each cached sequence's task."""
    for name, rows in split.items():
        cached = []
        for path in chunks(folder, name):
            with safe_open(str(path), framework="pt") as handle:
                ids, lengths = handle.get_tensor("input_ids"), handle.get_tensor("lengths")
            cached += [part.tolist() for part in ids.split(lengths.tolist())]
        if cached != [prompt + answer for _, prompt, answer in rows]:
            return False
    return True


def chunks(folder: Path, split: str) -> list[Path]:
    return sorted(folder.glob(f"{split}-*.safetensors"))


def chunk_tasks(folder: Path, split: str) -> dict[str, list[str]]:
    """The task of each cached sequence of `split`, per chunk file name (from `features.json`'s settings)."""
    settings = json.loads((folder / FEATURES_META).read_text())["settings"]
    tasks = [task for task, count in settings["sequence_tasks"][split] for _ in range(count)]
    size = settings["chunk_sequences"]
    return {path.name: tasks[int(path.stem.split("-")[1]) * size :][:size] for path in chunks(folder, split)}


TOKEN_TENSORS = ("features", "input_ids", "labels", "scored")  # one row per position


def read_chunk(path: Path) -> list[dict]:
    """The sequences of one chunk file, each ``{"features", "input_ids", "labels", "prompt_length", "scored"}`` (chunks
    cached before ``scored`` was stored: from the prompt length, as `scored_positions` without spans)."""
    data = load_file(str(path))
    ends = data["lengths"].cumsum(0).tolist()
    rows = []
    for end, n, p in zip(ends, data["lengths"].tolist(), data["prompt_lengths"].tolist()):
        row = {k: data[k][end - n : end] for k in TOKEN_TENSORS if k in data}
        row["prompt_length"] = int(p)
        row.setdefault("scored", scored_positions(n, int(p), None))
        rows.append(row)
    return rows


class SequenceReader:
    """Reads single cached sequences from any chunk (safetensors slices: only that sequence's bytes), for batches
    drawn from every chunk at once (``--shuffle global``)."""

    def __init__(self) -> None:
        self._handles: dict[Path, tuple] = {}

    def _open(self, path: Path):
        if path not in self._handles:
            handle = safe_open(str(path), framework="pt")
            self._handles[path] = (handle, handle.get_tensor("prompt_lengths").tolist(), set(handle.keys()))
        return self._handles[path]

    def read(self, path: Path, start: int, length: int, index: int, names=TOKEN_TENSORS) -> dict:
        """Sequence `index` of chunk `path`, whose tokens are rows ``start .. start + length - 1`` (the tensors
        `names` of it, and its prompt length)."""
        handle, prompt_lengths, keys = self._open(path)
        row = {k: handle.get_slice(k)[start : start + length] for k in names if k in keys}
        row["prompt_length"] = int(prompt_lengths[index])
        row.setdefault("scored", scored_positions(length, row["prompt_length"], None))
        return row


def sequence_index(folder: Path, split: str, task: str | None = None) -> list[tuple[Path, int, int, int]]:
    """``(chunk file, first row, length, index in the chunk)`` of every cached sequence of `split` (only `task`'s when
    given), in cache order."""
    tasks = None if task is None else chunk_tasks(folder, split)
    index = []
    for path in chunks(folder, split):
        with safe_open(str(path), framework="pt") as handle:
            lengths = handle.get_tensor("lengths").tolist()
        start = 0
        for i, n in enumerate(lengths):
            if tasks is None or tasks[path.name][i] == task:
                index.append((path, start, n, i))
            start += n
    return index


def pad_batch(group: list[dict]) -> dict:
    """Sequences (`read_chunk`'s dicts) as one right-padded batch: ``features`` (B, N, k H), ``input_ids``,
    ``labels``, ``scored`` (B, N; False past a sequence's end), ``lengths`` and ``prompt_lengths`` (B,)."""
    width = max(len(s["input_ids"]) for s in group)
    batch = {
        "features": torch.zeros(len(group), width, group[0]["features"].shape[1]),
        "input_ids": torch.zeros(len(group), width, dtype=torch.long),
        "labels": torch.zeros(len(group), width, dtype=torch.long),
        "scored": torch.zeros(len(group), width, dtype=torch.bool),
        "lengths": torch.tensor([len(s["input_ids"]) for s in group]),
        "prompt_lengths": torch.tensor([s["prompt_length"] for s in group]),
    }
    for row, s in enumerate(group):
        n = len(s["input_ids"])
        for key in batch:
            if key not in ("lengths", "prompt_lengths"):
                batch[key][row, :n] = s[key].to(batch[key].dtype)
    return batch


def batches(
    folder: Path,
    split: str,
    batch_size: int,
    rng: random.Random | None,
    task: str | None = None,
    shuffle: str = "chunk",
):
    """Right-padded batches (`pad_batch`; only `task`'s sequences when given). Without `rng`, in cache order. With
    it, `shuffle` ``"chunk"``: the chunks in random order, the sequences shuffled within each (a batch holds one
    chunk's sequences: mostly one task's, as the cache is written task by task); ``"global"``: every sequence of the
    split in one random order (`SequenceReader`)."""
    if rng is not None and shuffle == "global":
        index, reader = sequence_index(folder, split, task), SequenceReader()
        rng.shuffle(index)
        for start in range(0, len(index), batch_size):
            yield pad_batch([reader.read(*entry) for entry in index[start : start + batch_size]])
        return
    files = chunks(folder, split)
    tasks = None if task is None else chunk_tasks(folder, split)
    if rng is not None:
        rng.shuffle(files)
    for path in files:
        if tasks is not None and task not in tasks[path.name]:
            continue  # the cache is in task order: most chunks hold one task
        sequences = read_chunk(path)
        if tasks is not None:
            sequences = [s for s, t in zip(sequences, tasks[path.name], strict=True) if t == task]
        if rng is not None:
            rng.shuffle(sequences)
        for start in range(0, len(sequences), batch_size):
            yield pad_batch(sequences[start : start + batch_size])


def count_batches(folder: Path, split: str, batch_size: int, task: str | None = None, shuffle: str = "chunk") -> int:
    """How many batches `batches` yields with an `rng` (read from the chunk files' headers)."""
    if shuffle == "global":
        return -(-len(sequence_index(folder, split, task)) // batch_size)
    tasks = None if task is None else chunk_tasks(folder, split)
    total = 0
    for path in chunks(folder, split):
        with safe_open(str(path), framework="pt") as handle:
            size = handle.get_slice("lengths").get_shape()[0]
        size = size if tasks is None else sum(t == task for t in tasks[path.name])
        total += -(-size // batch_size)
    return total


def draft_vocabulary(folder: Path, vocab_size: int, draft_vocab_size: int) -> list[int]:
    """The `draft_vocab_size` target ids most often the greedy label of a scored position in the training chunks
    (ties by id), in increasing id order."""
    counts, reader = torch.zeros(vocab_size, dtype=torch.long), SequenceReader()  # (the labels only, not features)
    for path, start, length, i in sequence_index(folder, "train"):
        s = reader.read(path, start, length, i, ("labels", "scored"))
        counts += torch.bincount(s["labels"][s["scored"]], minlength=vocab_size)
    order = sorted(range(vocab_size), key=lambda t: (-int(counts[t]), t))
    return sorted(order[:draft_vocab_size])


# ======================================================================================================================
# the training-time test
# ======================================================================================================================
def unrolled_logits(head: FeatureHead, features: torch.Tensor, input_ids: torch.Tensor, steps: int) -> list:
    """Draft-vocabulary logits of every entry at each of `steps` training-time-test steps (module docstring, 3.).

    `features` ``(B, N, k H)`` and `input_ids` ``(B, N)``; entry ``c`` in ``0 .. N - 2``. Returns one tensor per step
    ``s``, ``(B, N - 1 - s, Vd)``: row ``c`` is what `FeatureHead.draft` scores for draft ``s + 1`` after committing
    entries ``0 .. c``, had it drafted ``x_{c+2} .. x_{c+1+s}`` before.
    """
    layer, attn = head.layers[0], head.layers[0].self_attn
    batch, entries = input_ids.shape[0], input_ids.shape[1] - 1
    hidden = head.fuse(features[:, :entries])
    keys, values, out = [], [], []
    for step in range(steps):
        rows = entries - step
        if rows < 1:
            break
        ids, hid = input_ids[:, 1 + step : 1 + step + rows], hidden[:, :rows]
        embeds = head.embedding(ids).to(hid.dtype)
        positions = torch.arange(rows, device=ids.device) + 1 + step
        cos, sin = head.rotary_emb(embeds, positions.expand(batch, -1))
        normed = layer.hidden_norm(hid)
        residual = normed if layer.norm_before_residual else hid
        x = torch.cat([layer.input_layernorm(embeds), normed], dim=-1)
        q = attn.q_proj(x).view(batch, rows, attn.heads, attn.dim).transpose(1, 2)
        k = attn.k_proj(x).view(batch, rows, attn.kv_heads, attn.dim).transpose(1, 2)
        v = attn.v_proj(x).view(batch, rows, attn.kv_heads, attn.dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys.append(k)
        values.append(v)
        query = torch.arange(rows, device=ids.device)[:, None]
        masks = [torch.arange(entries, device=ids.device)[None, :] <= query]  # step 0: entries 0 .. c
        masks += [torch.arange(entries - t, device=ids.device)[None, :] == query for t in range(1, step + 1)]
        groups = attn.heads // attn.kv_heads
        k_all = torch.cat(keys, dim=2).repeat_interleave(groups, dim=1)
        v_all = torch.cat(values, dim=2).repeat_interleave(groups, dim=1)
        att = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=torch.cat(masks, dim=1))
        u = residual + attn.o_proj(att.transpose(1, 2).reshape(batch, rows, attn.heads * attn.dim))
        hidden = u + layer.mlp(layer.post_attention_layernorm(u))
        out.append(head.lm_head(head.norm(hidden)))
    return out


def step_targets(batch: dict, step: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The labels of step `step`'s `rows` entries (the target's greedy token at position ``c + 1 + step``) and the
    mask of those scored: the batch's scored positions (without spans: ``>= prompt length - 1``, inside the
    sequence)."""
    return batch["labels"][:, 1 + step : 1 + step + rows], batch["scored"][:, 1 + step : 1 + step + rows]


def draft_index(head: FeatureHead) -> torch.Tensor:
    """Target id -> draft id, ``(V,)`` (0 where the target id has none: read it only where ``t2d``)."""
    index = torch.zeros(head.config.vocab_size, dtype=torch.long)
    draft = torch.arange(head.config.draft_vocab_size)
    index[head.draft_to_target(draft).cpu()] = draft
    return index


def batch_loss(head: FeatureHead, batch: dict, steps: int) -> tuple[torch.Tensor, list]:
    """The training objective ``sum_s 0.8^s * L_s`` and what each step got right.

    ``L_s`` is the cross-entropy of step ``s`` against the target's greedy token over the scored entries whose label
    is in the draft vocabulary. Returns ``(objective, [(correct, scored), ...])``: per step, ``(B, N - 1 - s)`` masks
    of the entries whose top-1 is the target's greedy token (every scored entry counts, labels outside the draft
    vocabulary as misses) and of the scored ones."""
    t2d, draft_id = head.t2d.cpu(), draft_index(head)
    loss, outcome = torch.zeros(()), []
    for step, logits in enumerate(unrolled_logits(head, batch["features"], batch["input_ids"], steps)):
        labels, mask = step_targets(batch, step, logits.shape[1])
        outcome.append((head.draft_to_target(logits.argmax(-1)) == labels, mask))
        trained = mask & t2d[labels]
        if trained.any():
            loss = loss + STEP_WEIGHT**step * F.cross_entropy(logits[trained].float(), draft_id[labels[trained]])
    return loss, outcome


def step_counts(outcome: list) -> torch.Tensor:
    """Per sequence and step ``s``, ``(B, steps, 4)``: ``[hits, scored, conditional hits, conditional scored]``.

    Full accuracy at step ``s`` is hits / scored over every scored entry (teacher-forced: the head reads the
    target's tokens for steps ``< s``); conditional accuracy counts only the entries whose steps ``0 .. s - 1`` were
    all correct (scored and the target's token), as speculators reports it: the chance that draft token ``s + 1``
    is accepted once the ``s`` before it were. Step 0's are the same.

    Example (one sequence, every entry scored; steps 0, 1, 2 right on entries {0, 1, 3}, {0, 2}, {1}):
        >>> hit = [torch.tensor([[1, 1, 0, 1]]), torch.tensor([[1, 0, 1]]), torch.tensor([[0, 1]])]
        >>> step_counts([(h.bool(), torch.ones_like(h).bool()) for h in hit])[0].tolist()
        [[3, 4, 3, 4], [2, 3, 1, 2], [1, 2, 0, 1]]
    """
    rows, chain = [], None
    for correct, scored in outcome:
        width = correct.shape[1]
        hit = correct & scored
        given = scored if chain is None else scored & chain[:, :width]
        rows.append(torch.stack([x.sum(1) for x in (hit, scored, hit & given, given)], dim=-1))
        chain = hit if chain is None else chain[:, :width] & hit
    return torch.stack(rows, dim=1)


def ratio_se(hits: torch.Tensor, counts: torch.Tensor) -> float:
    """The standard error of ``sum hits / sum counts`` over sequences (each sequence one cluster of correlated
    positions: the ratio estimator's linearised variance, ``m / (m - 1)`` corrected)."""
    keep = counts > 0
    hits, counts = hits[keep].double(), counts[keep].double()
    m = int(keep.sum())
    if m < 2:
        return float("nan")
    ratio = hits.sum() / counts.sum()
    return float(((hits - ratio * counts).pow(2).sum() * m / (m - 1)).sqrt() / counts.sum())


def paired_difference(a: list, b: list, cols: tuple[int, int]) -> tuple[float, float]:
    """``r_a - r_b`` of two runs' ratios over the same held-out sequences and its standard error, from
    `evaluate`'s ``per_sequence`` rows; `cols` = (hits, scored) (``(0, 1)`` step 0, ``(2, 3)`` conditional step 1).

    With ``r = sum(h) / sum(n)`` per run, the linearised ratio estimator's error over the ``m`` shared sequences::

        e_i = (h_ai - r_a n_ai) / sum(n_a) - (h_bi - r_b n_bi) / sum(n_b),   se = sqrt(m / (m - 1) * sum_i e_i ** 2)

    (the held-out sampling noise only: a second training order measures the run-to-run noise; docs/benchmarks.md);
    NaN and NaN where a run scored nothing.

    Example (two runs, three held-out sequences):
        >>> a = [[2, 4, 1, 2], [3, 4, 1, 3], [1, 4, 0, 1]]
        >>> b = [[1, 4, 1, 1], [2, 4, 1, 2], [1, 4, 0, 1]]
        >>> d, se = paired_difference(a, b, (0, 1))
        >>> round(d, 3), round(se, 3)
        (0.167, 0.083)
    """
    ha, na = [r[cols[0]] for r in a], [r[cols[1]] for r in a]
    hb, nb = [r[cols[0]] for r in b], [r[cols[1]] for r in b]
    if len(ha) != len(hb) or len(ha) < 2:
        raise ValueError(f"both runs must hold the same >= 2 held-out sequences, but hold {len(ha)} and {len(hb)}.")
    if not sum(na) or not sum(nb):  # e.g. no entry of conditional step 1 whose step 0 was right
        return float("nan"), float("nan")
    ra, rb = sum(ha) / sum(na), sum(hb) / sum(nb)
    e = [(h1 - ra * n1) / sum(na) - (h2 - rb * n2) / sum(nb) for h1, n1, h2, n2 in zip(ha, na, hb, nb, strict=True)]
    return ra - rb, math.sqrt(sum(x * x for x in e) * len(e) / (len(e) - 1))


@torch.no_grad()
def evaluate(head: FeatureHead, folder: Path, args, task: str | None = None) -> dict:
    """The held-out loss and, per training-time-test step, full and conditional top-1 agreement (`step_counts`) with
    the target's greedy token, on `task`'s held-out sequences only when given. ``val_loss`` is the training
    objective; ``se_*`` the standard errors over held-out sequences (`ratio_se`); ``per_sequence`` ``[hits,
    scored]`` of step 0 and the conditional ones of step 1, per held-out sequence in cache order (for paired
    comparisons of runs)."""
    head.eval()
    loss, count, per_sequence = 0.0, 0, []
    for batch in batches(folder, "val", args.batch_size, None, task):
        value, outcome = batch_loss(head, batch, args.ttt_steps)
        loss += float(value)
        count += 1
        per_sequence.append(step_counts(outcome))
    counts = torch.cat(per_sequence)  # (sequences, steps, 4)
    totals = counts.sum(0).tolist()
    row = {"val_loss": loss / max(count, 1)}
    for s, (hit, n, cond_hit, cond_n) in enumerate(totals):
        row[f"agreement_step{s}"] = hit / max(n, 1)
        if s:
            row[f"conditional_step{s}"] = cond_hit / max(cond_n, 1)
    row["se_agreement_step0"] = ratio_se(counts[:, 0, 0], counts[:, 0, 1])
    if counts.shape[1] > 1:
        row["se_conditional_step1"] = ratio_se(counts[:, 1, 2], counts[:, 1, 3])
    row["val_sequences"], row["val_positions"] = counts.shape[0], int(counts[:, 0, 1].sum())
    columns = [0, 1, 6, 7] if counts.shape[1] > 1 else [0, 1]  # step 0's [hits, scored], step 1's conditional ones
    row["per_sequence"] = counts[:, :2, :].reshape(len(counts), -1)[:, columns].tolist()
    return row


# ======================================================================================================================
# the run
# ======================================================================================================================
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stores", type=Path, default=REPO_ROOT / "artifacts" / "task-outputs")
    p.add_argument(
        "--models", default="smollm2", choices=["smollm2", "qwen"], help="the target (as `hf-metasd bench`)"
    )
    p.add_argument("--tasks", nargs="+", default=list(TASKS))
    p.add_argument("--out", type=Path, default=None, help="default artifacts/feature-head(-adapters with --lora-task)")
    p.add_argument("--work-dir", type=Path, default=REPO_ROOT / "artifacts" / "feature-head-features")
    p.add_argument("--max-sequences", type=int, default=None, help="stored sequences read per task (default all)")
    p.add_argument("--val-sequences", type=int, default=4, help="held-out training sequences per task (the first)")
    p.add_argument("--layer-ids", type=int, nargs="+", default=None, help="default EAGLE-3's (2, L // 2, L - 3)")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--intermediate-size", type=int, default=None, help="the head's MLP width (default the target's)")
    p.add_argument("--ttt-steps", type=int, default=3, help="training-time-test steps (>= 2 for step-1 agreement)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps (default: none)")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4, help="the peak learning rate")
    p.add_argument("--schedule", default="constant", choices=["constant", "cosine"], help="after the warm-up")
    p.add_argument("--warmup", type=int, default=0, help="optimizer steps of linear warm-up to --lr")
    p.add_argument("--betas", type=float, nargs=2, default=[0.9, 0.999], help="AdamW's (EAGLE-3: 0.9 0.95)")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip", type=float, default=0.5, help="gradient norm clip")
    p.add_argument(
        "--shuffle",
        default="chunk",
        choices=["chunk", "global"],
        help="chunk: chunks in random order, sequences shuffled within one (mostly one task a batch); global: all "
        "sequences in one random order",
    )
    p.add_argument(
        "--lm-head",
        default="target",
        choices=["random", "target", "target-frozen"],
        help="a new head's LM head: the target's LM head rows of the draft vocabulary (fine-tuned, or frozen), or "
        "random (`--init-head` continues the saved head's)",
    )
    p.add_argument(
        "--train-only-tasks", nargs="*", default=[], help="stores trained on whole, never held out (e.g. sharegpt)"
    )
    p.add_argument("--feature-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument(
        "--autocast",
        default="none",
        choices=["none", "bfloat16"],
        help="training passes under CPU autocast to bfloat16 (float32 weights; held-out figures in float32)",
    )
    p.add_argument("--chunk-sequences", type=int, default=64, help="sequences per feature file")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the target's dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="1 while another job uses the cores (2 then is ~15x slower)")
    p.add_argument("--init-head", type=Path, default=None, help="continue training this saved head (more epochs)")
    p.add_argument(
        "--round-bfloat16",
        action="store_true",
        help="round the trained weights to bfloat16 numbers (stored in half the bytes), then evaluate again",
    )
    p.add_argument("--lora-task", action="append", default=[], help="train an adapter for this task (repeatable)")
    p.add_argument("--base-head", type=Path, default=None, help="the trained head the adapters adapt (--lora-task)")
    p.add_argument("--lora-rank", type=int, default=16, help="the adapters' LoRA rank")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "ttt_steps", "draft_vocab_size", "chunk_sequences", "threads", "lora_rank"):
        if getattr(args, name) < 1:
            p.error(f"`--{name.replace('_', '-')}` must be >= 1, but is {getattr(args, name)}.")
    if args.max_steps is not None and args.max_steps < 1:
        p.error(f"`--max-steps` must be >= 1, but is {args.max_steps}.")
    if args.warmup < 0:
        p.error(f"`--warmup` must be >= 0, but is {args.warmup}.")
    if args.lora_task and args.base_head is None:
        p.error("`--lora-task` must come with `--base-head DIR` (a head trained by this recipe), but it is missing.")
    unknown = sorted(set(args.lora_task) - set(args.tasks))
    if unknown:
        p.error(f"`--lora-task` must name tasks of `--tasks` {args.tasks}, but names {unknown}. Pass one of them.")
    if args.out is None:
        args.out = REPO_ROOT / "artifacts" / ("feature-head-adapters" if args.lora_task else "feature-head")
    return args


@torch.no_grad()
def init_lm_head(head: FeatureHead, target, frozen: bool) -> None:
    """The head's LM head from the target's: the rows of its draft vocabulary (``d2t``), as speculators does;
    `frozen`: not trained (its rows stay the target's)."""
    rows = target.get_output_embeddings().weight[head.draft_to_target(torch.arange(head.config.draft_vocab_size))]
    head.lm_head.weight.copy_(rows.to(head.lm_head.weight.dtype))
    head.lm_head.weight.requires_grad_(not frozen)


def commit() -> str | None:
    """The checkout's short commit (read-only), or None outside a git checkout."""
    result = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else None


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total`, as a share of the peak: linear from
    ``1 / warmup`` to 1 over the first `warmup` steps, then 1 (``"constant"``) or a cosine from 1 down to 0 at the
    last step's end (``"cosine"``).

    Example:
        >>> [round(lr_factor(s, 6, 2, "cosine"), 3) for s in range(6)]
        [0.5, 1.0, 1.0, 0.854, 0.5, 0.146]
    """
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))


def train(head: FeatureHead, args, task: str | None = None) -> list[dict]:
    """``--epochs`` epochs (at most ``--max-steps`` optimizer steps) of AdamW (``--betas``, ``--lr`` on the
    ``--warmup`` / ``--schedule`` shape of `lr_factor`) on the head's trainable parameters (the whole head but a
    frozen LM head, or an adapter), the forward and backward passes under ``--autocast`` (float32 weights and
    optimizer either way), on `task`'s training sequences only when given; one row per epoch (train loss, speed,
    held-out metrics on the same task; the last row keeps `evaluate`'s ``per_sequence``)."""
    optimizer = torch.optim.AdamW(
        [p for p in head.parameters() if p.requires_grad],
        lr=args.lr,
        weight_decay=args.weight_decay,
        betas=tuple(args.betas),
    )
    rng, epochs = random.Random(args.seed), []
    n_batches = count_batches(args.work_dir, "train", args.batch_size, task, args.shuffle)
    total_steps = n_batches * args.epochs if args.max_steps is None else min(args.max_steps, n_batches * args.epochs)
    done = 0
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, args.warmup, args.schedule)
    )
    for epoch in range(1, -(-total_steps // n_batches) + 1):
        head.train()
        start, total, entries = time.perf_counter(), 0.0, 0
        stream = batches(args.work_dir, "train", args.batch_size, rng, task, args.shuffle)
        steps = min(n_batches, total_steps - done)
        bar = tqdm(itertools.islice(stream, steps), total=steps, desc=f"epoch {epoch}", mininterval=10)
        for count, batch in enumerate(bar, 1):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast == "bfloat16"):
                loss, _ = batch_loss(head, batch, args.ttt_steps)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), args.clip)
            optimizer.step()
            scheduler.step()
            total += float(loss.detach())
            entries += int((batch["lengths"] - 1).sum())
            bar.set_postfix(loss=f"{total / count:.3f}")
        done += steps
        seconds = time.perf_counter() - start
        row = {
            "epoch": epoch,
            "train_loss": total / steps,
            "steps": done,
            "tokens_per_s": entries / seconds,
            "seconds": seconds,
            **evaluate(head, args.work_dir, args, task),
        }
        epochs.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "per_sequence"}), flush=True)
    for row in epochs[:-1]:
        row.pop("per_sequence")
    return epochs


def train_adapters(args, target, split: dict[str, list]) -> dict:
    """Section 5 of the module docstring: one adapter per ``--lora-task`` on the frozen ``--base-head``."""
    counts = {
        task: {name: sum(t == task for t, _, _ in rows) for name, rows in split.items()} for task in args.lora_task
    }
    for task, count in counts.items():
        if not all(count.values()):
            raise SystemExit(
                f"`--lora-task` {task!r} must have training and held-out sequences, but has {count}. Pass a task "
                "whose store holds more than `--val-sequences` sequences."
            )
    head = load_feature_head(args.base_head, target).float()
    meta = cache_features(target, args, split, head.config.layer_ids)
    tasks = {}
    for task in args.lora_task:
        set_active_adapter(head, None)
        base = evaluate(head, args.work_dir, args, task)
        shown = {k: v for k, v in base.items() if k != "per_sequence"}
        print(f"{task}: base head {shown}", flush=True)
        add_adapter(head, task, r=args.lora_rank)  # active and trainable; the head and other adapters frozen
        epochs = train(head, args, task)
        step0 = paired_difference(epochs[-1]["per_sequence"], base["per_sequence"], (0, 1))
        step1 = paired_difference(epochs[-1]["per_sequence"], base["per_sequence"], (2, 3))
        kept = step0[0] > KEEP_STANDARD_ERRORS * step0[1]
        if kept:
            save_adapter(head, task, args.out / "adapters" / task)
        print(
            f"{task}: step 0 {base['agreement_step0']:.3f} -> {epochs[-1]['agreement_step0']:.3f} (paired "
            f"{step0[0]:+.3f} ± {step0[1]:.3f}), conditional step 1 {step1[0]:+.3f} ± {step1[1]:.3f}: "
            + ("kept" if kept else f"dropped (not above {KEEP_STANDARD_ERRORS:g} standard errors), not saved"),
            flush=True,
        )
        tasks[task] = {
            "sequences": counts[task],
            "base": base,
            "epochs": epochs,
            "paired_step0": list(step0),
            "paired_conditional_step1": list(step1),
            "kept": kept,
        }
    set_active_adapter(head, None)
    save_head(head.eval(), args.out)  # the base head's own weights, beside its adapters
    record = {
        "commit": commit(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "config": head.config.to_dict(),
        "features": {k: v for k, v in meta.items() if k != "settings"},
        "tasks": tasks,
    }
    (args.out / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True))
    saved = [task for task in args.lora_task if tasks[task]["kept"]]
    print(f"saved the head, adapters/{{{','.join(saved)}}} and {RECORD_NAME} to {args.out}", flush=True)
    return record


def main(argv=None, target=None) -> dict:
    """Train and save a head (or, with ``--lora-task``, adapters on a trained head); returns the run's record.
    `target` (a loaded model) replaces ``--models`` (tests)."""
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if target is None:
        from hf_metasd.benchmark.run import load_models

        target, _ = load_models(args.models, args.dtype, args.threads)
    torch.set_num_threads(args.threads)
    target.requires_grad_(False)
    split = read_stores(args.stores, args.tasks, args.max_sequences, args.val_sequences, args.train_only_tasks)
    if args.lora_task:
        return train_adapters(args, target, split)
    extra = {} if args.intermediate_size is None else {"intermediate_size": args.intermediate_size}
    layer_ids = None if args.layer_ids is None else tuple(args.layer_ids)
    config = FeatureHeadConfig.for_target(target, layer_ids=layer_ids, draft_vocab_size=args.draft_vocab_size, **extra)
    meta = cache_features(target, args, split, config.layer_ids)
    if args.init_head is None:
        head = FeatureHead(config, target.get_input_embeddings(), dtype=torch.float32)
        head.set_vocab_map(draft_vocabulary(args.work_dir, config.vocab_size, config.draft_vocab_size))
        if args.lm_head != "random":
            init_lm_head(head, target, frozen=args.lm_head == "target-frozen")
    else:  # more epochs for a saved head (its config, vocabulary map and weights; the optimizer starts afresh)
        head = load_feature_head(args.init_head, target).float().requires_grad_(True)
        config = head.config
    untrained = evaluate(head, args.work_dir, args)
    untrained.pop("per_sequence")
    print(f"{'untrained' if args.init_head is None else 'start'}: {untrained}", flush=True)
    epochs = train(head, args)
    if args.round_bfloat16:  # what is stored is what is measured: the held-out figures of the rounded head
        round_to_bfloat16(head)
        epochs.append({"rounded_to_bfloat16": True, **evaluate(head, args.work_dir, args)})
        epochs[-2].pop("per_sequence", None)
        print(json.dumps({k: v for k, v in epochs[-1].items() if k != "per_sequence"}), flush=True)
    save_head(head.eval(), args.out)
    record = {
        "commit": commit(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "config": config.to_dict(),
        "features": {k: v for k, v in meta.items() if k != "settings"},
        "untrained": untrained,
        "epochs": epochs,
    }
    (args.out / RECORD_NAME).write_text(json.dumps(record, indent=2, sort_keys=True))
    print(f"saved the head and {RECORD_NAME} to {args.out}", flush=True)
    return record


if __name__ == "__main__":
    main()
